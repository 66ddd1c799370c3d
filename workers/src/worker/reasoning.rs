//! A reasoning model's thinking, split from its answer. [`ReasoningFilter`] sits
//! between the backend's tokens and the chunks of a request with `split_reasoning`:
//! a `<think>…</think>` section opening the answer (or opened by the template, as
//! DeepSeek-R1's and QwQ's do) comes out in tokens marked `reasoning`, without its
//! tags and the whitespace around them; the answer after it as plain tokens.
//!
//! Every token the backend gives goes out once, with its id and log-probability, in
//! order — only its text moves: text that might still be a tag is held back (the
//! token goes out with less text, or none) and rides on a later token. So a client
//! counts tokens and resumes a stream exactly as without the split. Only where one
//! token holds the end of the reasoning and the start of the answer does the answer's
//! part wait for the next token (or, at the end, a last token of its own).

use switchyard_engine::text::template::{THINK_CLOSE, THINK_OPEN};
use switchyard_messages::Token;

/// What stands between a backend's tokens and a request's chunks: the reasoning
/// split (a request with `split_reasoning`), then the tool-call parser (a chat that
/// offered tools) on the answer's tokens.
#[derive(Default)]
pub struct Filters {
    pub reasoning: Option<ReasoningFilter>,
    pub calls: Option<crate::worker::tools::calls::CallFilter>,
}

impl Filters {
    /// Takes one generated token; returns what may be sent now.
    pub fn push(&mut self, token: Token) -> Vec<Token> {
        let token = match &mut self.reasoning {
            Some(f) => f.push(token),
            None => token,
        };
        self.push_calls(token)
    }

    /// The end of the answer: the text still held, and the calls parsed out of it.
    pub fn finish(&mut self) -> (Vec<Token>, Vec<switchyard_messages::ToolCall>) {
        let mut tail = Vec::new();
        if let Some(t) = self.reasoning.as_mut().and_then(ReasoningFilter::finish) {
            tail = self.push_calls(t);
        }
        match &mut self.calls {
            Some(calls) => {
                let (more, parsed) = calls.finish();
                tail.extend(more);
                (tail, parsed)
            }
            None => (tail, Vec::new()),
        }
    }

    fn push_calls(&mut self, token: Token) -> Vec<Token> {
        match &mut self.calls {
            Some(calls) if !token.reasoning => calls.push(token),
            _ => vec![token],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Nothing but whitespace yet: the answer may still open a section.
    Start,
    /// Inside the section.
    Thinking,
    /// Just after `</think>`: whitespace before the answer is dropped.
    Closed,
    /// The answer.
    Answer,
}

/// Splits one stream's reasoning from its answer.
#[derive(Debug, Clone)]
pub struct ReasoningFilter {
    mode: Mode,
    /// Text taken but not yet sent (a possible tag, whitespace that may end the
    /// reasoning, or the answer's first piece after the section closed).
    pending: String,
    /// The reasoning sent so far is empty (its leading whitespace is dropped).
    fresh: bool,
    last_id: u32,
}

impl ReasoningFilter {
    /// A filter for an answer whose prompt `opened` a section (the answer starts
    /// inside the reasoning) or not.
    pub fn new(opened: bool) -> Self {
        Self {
            mode: if opened { Mode::Thinking } else { Mode::Start },
            pending: String::new(),
            fresh: true,
            last_id: 0,
        }
    }

    /// A filter past any reasoning: the rest is answer (a resumed stream whose
    /// given text is not known).
    pub fn answering() -> Self {
        Self {
            mode: Mode::Answer,
            ..Self::new(false)
        }
    }

    /// Takes `text` the client was already given (a resumed stream's): the filter
    /// is then where the lost one was, holding what it held.
    pub fn replay(&mut self, text: &str) {
        self.pending.push_str(text);
        self.advance();
    }

    /// Takes one generated token; returns it with the text that may be sent now.
    pub fn push(&mut self, mut token: Token) -> Token {
        self.last_id = token.id;
        self.pending.push_str(&token.text);
        let (reasoning, answer) = self.advance();
        if !reasoning.is_empty() {
            // The answer's first text (if this token holds it too) waits for the next.
            self.pending.insert_str(0, &answer);
            token.text = reasoning;
            token.reasoning = true;
        } else {
            token.text = answer;
            token.reasoning = self.mode == Mode::Thinking;
        }
        token
    }

    /// The end of the answer: the text still held, as a last token (none when
    /// nothing is held).
    pub fn finish(&mut self) -> Option<Token> {
        let text = std::mem::take(&mut self.pending);
        let (text, reasoning) = match self.mode {
            // A cut-off section: what it held was reasoning.
            Mode::Thinking => (text.trim_end().to_string(), true),
            Mode::Closed => return None,
            Mode::Start | Mode::Answer => (text, false),
        };
        (!text.is_empty()).then_some(Token {
            id: self.last_id,
            text,
            logprob: None,
            reasoning,
        })
    }

    /// Moves through `pending` as far as it can: the reasoning and the answer text
    /// it releases (the rest stays held).
    fn advance(&mut self) -> (String, String) {
        let (mut reasoning, mut answer) = (String::new(), String::new());
        loop {
            match self.mode {
                Mode::Start => {
                    let t = self.pending.trim_start();
                    if let Some(rest) = t.strip_prefix(THINK_OPEN) {
                        self.pending = rest.to_string();
                        self.mode = Mode::Thinking;
                    } else if THINK_OPEN.starts_with(t) {
                        return (reasoning, answer);
                    } else {
                        self.mode = Mode::Answer;
                    }
                }
                Mode::Thinking => {
                    if self.fresh {
                        let t = self.pending.trim_start();
                        if t.is_empty() {
                            self.pending.clear();
                            return (reasoning, answer);
                        }
                        self.pending = t.to_string();
                        self.fresh = false;
                    }
                    if let Some(at) = self.pending.find(THINK_CLOSE) {
                        reasoning.push_str(self.pending[..at].trim_end());
                        self.pending.drain(..at + THINK_CLOSE.len());
                        self.mode = Mode::Closed;
                        continue;
                    }
                    let keep = held(&self.pending);
                    let cut = self.pending.len() - keep;
                    reasoning.extend(self.pending.drain(..cut));
                    return (reasoning, answer);
                }
                Mode::Closed => {
                    let t = self.pending.trim_start();
                    if t.is_empty() {
                        self.pending.clear();
                        return (reasoning, answer);
                    }
                    self.pending = t.to_string();
                    self.mode = Mode::Answer;
                }
                Mode::Answer => {
                    answer.push_str(&self.pending);
                    self.pending.clear();
                    return (reasoning, answer);
                }
            }
        }
    }
}

/// Bytes at the end of reasoning text `p` to hold: a proper prefix of `</think>`
/// and the whitespace before it (trailing whitespace is dropped if the section
/// closes right after it).
fn held(p: &str) -> usize {
    let mut keep = 0;
    for k in (1..THINK_CLOSE.len()).rev() {
        if k <= p.len() && p.is_char_boundary(p.len() - k) && THINK_CLOSE.starts_with(&p[p.len() - k..]) {
            keep = k;
            break;
        }
    }
    let before = &p[..p.len() - keep];
    keep + (before.len() - before.trim_end().len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `pieces` through a filter: (reasoning, answer, tokens out).
    fn run(opened: bool, pieces: &[&str]) -> (String, String, usize) {
        let mut f = ReasoningFilter::new(opened);
        let mut out: Vec<Token> = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| f.push(Token::new(i as u32, *p)))
            .collect();
        out.extend(f.finish());
        let pick = |r: bool| {
            out.iter()
                .filter(|t| t.reasoning == r)
                .map(|t| t.text.as_str())
                .collect()
        };
        (pick(true), pick(false), out.len())
    }

    #[test]
    fn splits_a_section_opening_the_answer_in_any_pieces() {
        let text = "<think>\nLet me see.\n</think>\n\nParis.";
        let want = ("Let me see.".to_string(), "Paris.".to_string());
        // Every way of cutting the text in two or three pieces.
        for a in 0..=text.len() {
            for b in a..=text.len() {
                let (r, ans, n) = run(false, &[&text[..a], &text[a..b], &text[b..]]);
                assert_eq!((r, ans), want, "cut at {a}, {b}");
                assert!((3..=4).contains(&n), "cut at {a}, {b}: {n} tokens");
            }
        }
    }

    #[test]
    fn a_template_opened_section_needs_only_the_close() {
        assert_eq!(
            run(true, &["Think", "ing", " hard", "\n</", "think", ">\n\n", "Yes"]),
            ("Thinking hard".into(), "Yes".into(), 7)
        );
    }

    #[test]
    fn answers_without_a_section_pass_untouched() {
        assert_eq!(
            run(false, &["  Hello", " <think>", " world"]),
            ("".into(), "  Hello <think> world".into(), 3)
        );
        // Whitespace and a partial tag held at the start go out once they are not one.
        assert_eq!(
            run(false, &["\n", "<th", "ought>"]),
            ("".into(), "\n<thought>".into(), 3)
        );
        assert_eq!(run(false, &["\n", "<thi"]), ("".into(), "\n<thi".into(), 3));
    }

    #[test]
    fn a_section_cut_off_is_all_reasoning() {
        assert_eq!(
            run(false, &["<think>", "still ", "going </th"]),
            ("still going </th".into(), "".into(), 4)
        );
        // Tokens after the close that are only whitespace give nothing.
        assert_eq!(run(false, &["<think>a</think>", "\n\n"]), ("a".into(), "".into(), 2));
    }

    #[test]
    fn one_token_holding_the_close_and_the_answer_passes_the_answer_on() {
        let mut f = ReasoningFilter::new(true);
        let t = f.push(Token::new(1, "done</think>\n\nHi"));
        assert!(t.reasoning);
        assert_eq!(t.text, "done");
        let t = f.push(Token::new(2, " there"));
        assert!(!t.reasoning);
        assert_eq!((t.id, t.text.as_str()), (2, "Hi there"));
        assert!(f.finish().is_none());
    }

    #[test]
    fn a_replayed_filter_goes_on_where_the_lost_one_was() {
        // The lost stream's client got "abc" as reasoning; " </th" was held.
        let mut f = ReasoningFilter::new(false);
        f.replay("<think>\nabc </th");
        let t = f.push(Token::new(9, "ink>\n\nHi"));
        assert_eq!((t.reasoning, t.text.as_str()), (false, "Hi"));
        let mut f = ReasoningFilter::new(true);
        f.replay("ab");
        let t = f.push(Token::new(9, " cd"));
        assert_eq!((t.reasoning, t.text.as_str()), (true, " cd"));
        let mut f = ReasoningFilter::answering();
        let t = f.push(Token::new(1, "<think>x"));
        assert_eq!((t.reasoning, t.text.as_str()), (false, "<think>x"));
    }
}
