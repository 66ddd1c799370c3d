//! Every input limit: a request exactly at the limit passes, one over is refused
//! with `bad_request` naming the limit; and the checks `generate` applies apply to
//! `batch` and session `decode` alike (the fuzzing run's findings).

use switchyard_messages::session::{DecodeRequest, OpenSessionRequest, SegmentRequest};
use switchyard_messages::*;

/// Small limits, so "at" and "over" are cheap to build.
fn limits() -> InputLimits {
    InputLimits {
        max_prompt_bytes: 10,
        max_messages: 3,
        max_stop_strings: 2,
        max_stop_bytes: 4,
        max_stop_tokens: 2,
        max_tokens: 8,
        max_batch_prompts: 3,
        max_classify_prompts: 4,
        max_logits_prompts: 2,
        max_session_text_bytes: 12,
        max_constraint_bytes: 16,
        max_tools: 2,
        max_tool_bytes: 40,
    }
}

#[track_caller]
fn refused(r: Result<(), WireError>, limit: &str) {
    let e = r.expect_err("over the limit must be refused");
    assert_eq!(e.code, ErrorCode::BadRequest, "{e:?}");
    assert!(
        e.message.contains(&format!("limits.{limit} = ")),
        "{limit} not named: {}",
        e.message
    );
}

fn generate(prompt: &str) -> GenerateRequest {
    let mut r = GenerateRequest::generate("r1", "", prompt);
    r.config.max_tokens = 4;
    r
}

fn chat(n: usize, each: &str) -> GenerateRequest {
    let mut r = GenerateRequest::chat("r1", "", (0..n).map(|_| Message::new("user", each)).collect());
    r.config.max_tokens = 4;
    r
}

fn batch(prompts: usize, bytes: usize) -> BatchRequest {
    BatchRequest {
        head: RequestHead::new("r1", ""),
        prompts: vec!["a".repeat(bytes); prompts],
        config: GenerateConfig {
            max_tokens: 4,
            ..Default::default()
        },
    }
}

fn classify(prompts: usize, logits: bool) -> ClassifyRequest {
    ClassifyRequest {
        head: RequestHead::new("r1", ""),
        prompts: vec!["hi".into(); prompts],
        return_logits: logits,
    }
}

#[test]
fn prompt_bytes_and_messages() {
    let l = limits();
    assert!(validate_request(&generate(&"a".repeat(10)), false, &l).is_ok());
    refused(
        validate_request(&generate(&"a".repeat(11)), false, &l),
        "max_prompt_bytes",
    );
    // Chat: the sum of the contents, and the message count.
    assert!(validate_request(&chat(2, "abcde"), true, &l).is_ok());
    refused(validate_request(&chat(2, "abcdef"), true, &l), "max_prompt_bytes");
    assert!(validate_request(&chat(3, "a"), true, &l).is_ok());
    refused(validate_request(&chat(4, "a"), true, &l), "max_messages");
    // Each batch / classify prompt.
    assert!(validate_batch(&batch(1, 10), &l).is_ok());
    refused(validate_batch(&batch(1, 11), &l), "max_prompt_bytes");
}

#[test]
fn stops_and_max_tokens() {
    let l = limits();
    let with = |f: &dyn Fn(&mut GenerateConfig)| {
        let mut r = generate("hello");
        f(&mut r.config);
        validate_request(&r, false, &l)
    };
    assert!(with(&|c| c.stop = vec!["ab".into(), "cd".into()]).is_ok());
    refused(
        with(&|c| c.stop = vec!["a".into(), "b".into(), "c".into()]),
        "max_stop_strings",
    );
    assert!(with(&|c| c.stop = vec!["abcd".into()]).is_ok());
    refused(with(&|c| c.stop = vec!["abcde".into()]), "max_stop_bytes");
    assert!(with(&|c| c.stop_tokens = vec![1, 2]).is_ok());
    refused(with(&|c| c.stop_tokens = vec![1, 2, 3]), "max_stop_tokens");
    assert!(with(&|c| c.max_tokens = 8).is_ok());
    refused(with(&|c| c.max_tokens = 9), "max_tokens");
}

#[test]
fn batch_classify_and_logits_counts() {
    let l = limits();
    assert!(validate_batch(&batch(3, 1), &l).is_ok());
    refused(validate_batch(&batch(4, 1), &l), "max_batch_prompts");
    assert!(validate_classify(&classify(4, false), &l).is_ok());
    refused(validate_classify(&classify(5, false), &l), "max_classify_prompts");
    assert!(validate_classify(&classify(2, true), &l).is_ok());
    refused(validate_classify(&classify(3, true), &l), "max_logits_prompts");
}

#[test]
fn session_text() {
    let l = limits();
    let seg = |n: usize| SegmentRequest {
        v: 1,
        fence: "me".into(),
        text: "x".repeat(n),
        ..Default::default()
    };
    assert!(validate_segment(&seg(12), &l).is_ok());
    refused(validate_segment(&seg(13), &l), "max_session_text_bytes");
}

#[test]
fn batch_and_decode_get_the_generate_config_checks() {
    let l = InputLimits::default();
    let bad_configs: Vec<(&str, GenerateConfig)> = vec![
        (
            "temperature",
            GenerateConfig {
                temperature: f32::NAN,
                ..Default::default()
            },
        ),
        (
            "temperature",
            GenerateConfig {
                temperature: f32::INFINITY,
                ..Default::default()
            },
        ),
        (
            "temperature",
            GenerateConfig {
                temperature: -1.0,
                ..Default::default()
            },
        ),
        (
            "top_p",
            GenerateConfig {
                top_p: 1.5,
                ..Default::default()
            },
        ),
        (
            "min_p",
            GenerateConfig {
                min_p: f32::NAN,
                ..Default::default()
            },
        ),
        (
            "repeat_penalty",
            GenerateConfig {
                repeat_penalty: -1.0,
                ..Default::default()
            },
        ),
        (
            "logprobs",
            GenerateConfig {
                logprobs: Some(21),
                ..Default::default()
            },
        ),
        (
            "max_tokens",
            GenerateConfig {
                max_tokens: 0,
                ..Default::default()
            },
        ),
    ];
    for (field, config) in bad_configs {
        let mut b = batch(1, 5);
        b.config = config.clone();
        let e = validate_batch(&b, &l).unwrap_err();
        assert_eq!(e.code, ErrorCode::BadRequest);
        assert!(e.message.contains(field), "batch {field}: {}", e.message);
        let d = DecodeRequest {
            v: 1,
            fence: "me".into(),
            request_id: "d1".into(),
            config,
        };
        let e = validate_decode(&d, &l).unwrap_err();
        assert!(e.message.contains(field), "decode {field}: {}", e.message);
    }
}

#[test]
fn decode_request_ids_must_form_a_cancel_subject() {
    let l = InputLimits::default();
    for id in ["", "a.b", "a*", &"x".repeat(129)] {
        let d = DecodeRequest {
            v: 1,
            fence: "me".into(),
            request_id: id.into(),
            config: GenerateConfig::default(),
        };
        assert_eq!(
            validate_decode(&d, &l).unwrap_err().code,
            ErrorCode::BadRequest,
            "{id:?}"
        );
    }
    let ok = DecodeRequest {
        v: 1,
        fence: "me".into(),
        request_id: "x".repeat(128),
        config: GenerateConfig::default(),
    };
    assert!(validate_decode(&ok, &l).is_ok());
}

#[test]
fn session_calls_check_the_version() {
    for v in [2u32, 99, 255, u32::MAX] {
        assert_eq!(
            validate_session_call(v).unwrap_err().code,
            ErrorCode::UnsupportedVersion
        );
        let seg = SegmentRequest {
            v,
            ..Default::default()
        };
        assert_eq!(
            validate_segment(&seg, &InputLimits::default()).unwrap_err().code,
            ErrorCode::UnsupportedVersion
        );
        let open = OpenSessionRequest {
            v,
            ..OpenSessionRequest::new("me", "")
        };
        assert_eq!(validate_open(&open).unwrap_err().code, ErrorCode::UnsupportedVersion);
    }
    assert!(validate_session_call(1).is_ok());
    assert!(validate_open(&OpenSessionRequest::new("me", "")).is_ok());
    assert_eq!(
        validate_open(&OpenSessionRequest::new("", "")).unwrap_err().code,
        ErrorCode::BadRequest
    );
}

#[test]
fn constraints_and_tools() {
    let mut r = generate("hi");
    r.config.constraint = Some(Constraint::Regex {
        pattern: "a".repeat(16),
    });
    validate_request(&r, false, &limits()).unwrap();
    r.config.constraint = Some(Constraint::Regex {
        pattern: "a".repeat(17),
    });
    refused(validate_request(&r, false, &limits()), "max_constraint_bytes");
    r.config.constraint = Some(Constraint::Lark { grammar: String::new() });
    assert!(validate_request(&r, false, &limits()).is_err(), "an empty grammar");

    let tool = |name: &str| Tool {
        name: name.into(),
        ..Tool::default()
    };
    let mut c = chat(1, "hi");
    c.tools = vec![tool("a"), tool("b")];
    validate_request(&c, true, &limits()).unwrap();
    c.tools.push(tool("c"));
    refused(validate_request(&c, true, &limits()), "max_tools");
    c.tools = vec![Tool {
        name: "a".into(),
        description: "d".repeat(40),
        parameters: String::new(),
    }];
    refused(validate_request(&c, true, &limits()), "max_tool_bytes");
    for (tools, choice, needle) in [
        (vec![tool("a"), tool("a")], ToolChoice::Auto, "given twice"),
        (vec![tool("a b")], ToolChoice::Auto, "must be 1-64"),
        (vec![tool("a")], ToolChoice::Function { name: "z".into() }, "not among"),
        (vec![], ToolChoice::Required, "needs at least one tool"),
    ] {
        let mut c = chat(1, "hi");
        c.tools = tools;
        c.tool_choice = choice;
        let e = validate_request(&c, true, &limits()).unwrap_err();
        assert!(e.message.contains(needle), "{needle}: {}", e.message);
    }
    let mut g = generate("hi");
    g.tools = vec![tool("a")];
    let e = validate_request(&g, false, &limits()).unwrap_err();
    assert!(e.message.contains("only for chat"), "{}", e.message);
}
