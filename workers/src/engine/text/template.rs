//! Chat prompts rendered from the GGUF's own `tokenizer.chat_template` (Jinja) with
//! minijinja and its Python-compatibility methods (`.strip()`, `.items()`, …), the
//! way llama.cpp's server renders them.

use minijinja::{context, Environment, Error, ErrorKind};
use switchyard_messages::Message;

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos` / `eos` are the texts of the model's BOS/EOS tokens.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, Error> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_string())?;
        Ok(Self {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
        })
    }

    /// Renders `messages`, ending with the assistant's turn opener when
    /// `add_generation_prompt` is set.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, Error> {
        let tmpl = self.env.get_template("chat")?;
        let messages: Vec<_> = messages
            .iter()
            .map(|m| context! { role => m.role.clone(), content => m.content.clone() })
            .collect();
        tmpl.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        })
    }
}

/// ChatML, used when a GGUF carries no template.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_python_methods() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content.strip() }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let out = t.render(&[Message::new("user", "  hi ")], true).unwrap();
        assert_eq!(out, "<user>hi<assistant></s>");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&[], false).unwrap_err();
        assert!(err.to_string().contains("no system role"));
    }
}
