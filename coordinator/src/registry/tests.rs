use super::*;
use switchyard_messages::{ServedModel, PROTOCOL_VERSION};

fn worker(id: &str, backend: &str, model: &str) -> WorkerStatus {
    WorkerStatus {
        v: PROTOCOL_VERSION,
        worker_id: id.into(),
        device: backend.into(),
        backend: backend.into(),
        models: vec![ServedModel {
            name: model.into(),
            path: String::new(),
            info: Default::default(),
        }],
        capacity: 1,
        queue_capacity: 2,
        in_flight: 0,
        queued: 0,
        available: true,
        draining: false,
        host: "h".into(),
        pid: 1,
        started_at_ms: 1,
        seq: 1,
        completed: 0,
        version: "t".into(),
        kv: Default::default(),
        recent: Default::default(),
    }
}

fn q(model: &str) -> RouteQuery {
    RouteQuery {
        model: model.into(),
        ..Default::default()
    }
}

#[test]
fn prefers_backends_in_seed_order() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    for (id, b) in [
        ("c", "cpu"),
        ("l", "llama_cpp"),
        ("r", "rocm"),
        ("u", "cuda"),
        ("m", "metal"),
    ] {
        r.heartbeat(worker(id, b, "m1"), now);
    }
    assert_eq!(r.route(&q("m1")).unwrap(), vec!["m", "r", "l", "u", "c"]);
}

#[test]
fn saturated_preferred_worker_spills_to_the_next() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    let mut busy = worker("r", "rocm", "m1");
    busy.in_flight = 1;
    busy.queued = 2;
    r.heartbeat(busy, now);
    r.heartbeat(worker("c", "cpu", "m1"), now);
    assert_eq!(r.route(&q("m1")).unwrap(), vec!["c", "r"]);
}

#[test]
fn routed_requests_count_until_the_next_heartbeat() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    r.heartbeat(worker("a", "cpu", "m1"), now);
    r.heartbeat(worker("b", "cpu", "m1"), now);
    assert_eq!(r.route(&q("m1")).unwrap()[0], "a");
    r.routed("a", &[]);
    assert_eq!(r.route(&q("m1")).unwrap()[0], "b", "a is busy now");
    let mut hb = worker("a", "cpu", "m1");
    hb.seq = 2;
    r.heartbeat(hb, now);
    assert_eq!(r.route(&q("m1")).unwrap()[0], "a", "heartbeat resets the local count");
}

#[test]
fn pins_are_honoured() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    r.heartbeat(worker("r", "rocm", "m1"), now);
    r.heartbeat(worker("c", "cpu", "m1"), now);
    let pinned = RouteQuery {
        model: "m1".into(),
        backend: Some("cpu".into()),
        worker: None,
        blocks: Vec::new(),
    };
    assert_eq!(r.route(&pinned).unwrap(), vec!["c"]);
    let pinned = RouteQuery {
        model: "m1".into(),
        backend: None,
        worker: Some("r".into()),
        blocks: Vec::new(),
    };
    assert_eq!(r.route(&pinned).unwrap(), vec!["r"]);
    let none = RouteQuery {
        model: "m1".into(),
        backend: Some("metal".into()),
        worker: None,
        blocks: Vec::new(),
    };
    assert_eq!(r.route(&none).unwrap_err().code, ErrorCode::NoWorker);
}

#[test]
fn unknown_model_and_empty_fleet_are_distinct_errors() {
    let mut r = Registry::new(Duration::from_secs(3));
    assert_eq!(r.route(&q("m1")).unwrap_err().code, ErrorCode::NoWorker);
    r.heartbeat(worker("a", "cpu", "m1"), Instant::now());
    let err = r.route(&q("nope")).unwrap_err();
    assert_eq!(err.code, ErrorCode::UnknownModel);
    assert!(err.message.contains("m1"));
    assert_eq!(r.route(&q("")).unwrap(), vec!["a"], "empty model = any");
}

#[test]
fn draining_and_unavailable_workers_are_skipped() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    let mut d = worker("d", "metal", "m1");
    d.draining = true;
    let mut u = worker("u", "rocm", "m1");
    u.available = false;
    r.heartbeat(d, now);
    r.heartbeat(u, now);
    assert_eq!(r.route(&q("m1")).unwrap_err().code, ErrorCode::NoWorker);
    r.heartbeat(worker("c", "cpu", "m1"), now);
    assert_eq!(r.route(&q("m1")).unwrap(), vec!["c"]);
}

#[test]
fn silent_workers_expire() {
    let mut r = Registry::new(Duration::from_secs(3));
    let t0 = Instant::now();
    r.heartbeat(worker("a", "cpu", "m1"), t0);
    r.heartbeat(worker("b", "cpu", "m1"), t0 + Duration::from_secs(2));
    assert_eq!(r.expire(t0 + Duration::from_secs(4)), vec!["a".to_string()]);
    assert_eq!(r.len(), 1);
}

#[test]
fn stale_heartbeat_does_not_overwrite_newer() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    let mut newer = worker("a", "cpu", "m1");
    newer.seq = 5;
    newer.in_flight = 1;
    r.heartbeat(newer, now);
    r.heartbeat(worker("a", "cpu", "m1"), now);
    assert_eq!(r.views(now)[0].status.seq, 5);
}

#[test]
fn models_group_workers_and_backends() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    r.heartbeat(worker("b", "cpu", "m1"), now);
    r.heartbeat(worker("a", "rocm", "m1"), now);
    r.heartbeat(worker("c", "cpu", "m2"), now);
    let models = r.models();
    assert_eq!(models.len(), 2);
    assert_eq!(models[0].workers, vec!["a", "b"]);
    assert_eq!(models[0].backends.len(), 2);
}

fn kv(worker: &str, seq: u64, stored: &[u64], removed: &[u64]) -> KvEvent {
    KvEvent {
        v: PROTOCOL_VERSION,
        worker_id: worker.into(),
        seq,
        stored: stored.to_vec(),
        removed: removed.to_vec(),
    }
}

#[test]
fn kv_events_apply_in_order_and_a_gap_asks_for_a_snapshot() {
    let mut r = Registry::new(Duration::from_secs(3));
    assert!(!r.kv_event(&kv("a", 1, &[1, 2, 3], &[])));
    assert!(!r.kv_event(&kv("a", 2, &[4], &[3])));
    assert_eq!(r.overlap("a", &[1, 2, 3]), 2);
    assert_eq!(r.overlap("a", &[1, 2, 4]), 3);
    assert!(!r.kv_event(&kv("a", 2, &[9], &[])), "a duplicate is ignored");
    assert_eq!(r.overlap("a", &[9]), 0);
    assert!(r.kv_event(&kv("a", 5, &[9], &[])), "seq 3 and 4 were lost");
    assert_eq!(r.overlap("a", &[9]), 0, "nothing applied past a gap");
    r.kv_snapshot(KvSnapshot {
        v: PROTOCOL_VERSION,
        worker_id: "a".into(),
        seq: 5,
        blocks: vec![1, 9],
    });
    assert_eq!(r.overlap("a", &[1, 9]), 2);
    assert!(!r.kv_event(&kv("a", 6, &[], &[1])));
    assert_eq!(r.overlap("a", &[1, 9]), 0);
    // A restarted worker starts over at 1.
    assert!(!r.kv_event(&kv("a", 1, &[7], &[])));
    assert_eq!((r.overlap("a", &[7]), r.overlap("a", &[9])), (1, 0));
    // A coordinator that starts late sees a first event past 1: a gap.
    assert!(r.kv_event(&kv("b", 8, &[1], &[])));
}

#[test]
fn warm_prefixes_attract_requests_but_not_past_busy() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    for id in ["a", "b", "c"] {
        r.heartbeat(worker(id, "cpu", "m"), now);
    }
    r.kv_event(&kv("b", 1, &[10, 11], &[]));
    r.kv_event(&kv("c", 1, &[10], &[]));
    let warm = RouteQuery {
        model: "m".into(),
        blocks: vec![10, 11, 12],
        ..Default::default()
    };
    assert_eq!(
        r.route(&warm).unwrap(),
        vec!["b", "c", "a"],
        "longest warm prefix first"
    );
    // b is busy: an idle worker wins, the partly warm one first.
    r.routed("b", &[]);
    assert_eq!(r.route(&warm).unwrap(), vec!["c", "a", "b"]);
    // A prefix everyone holds: load decides.
    for id in ["a", "c"] {
        r.kv_event(&kv(id, if id == "a" { 1 } else { 2 }, &[10, 11], &[]));
    }
    r.routed("c", &[]);
    assert_eq!(r.route(&warm).unwrap()[0], "a");
    // A routed request's prefix counts as warm at once.
    r.routed("a", &[20, 21]);
    let next = RouteQuery {
        model: "m".into(),
        blocks: vec![20, 21, 22],
        ..Default::default()
    };
    assert_eq!(r.overlap("a", &next.blocks), 2);
    // A new prefix goes where it evicts least.
    let mut r2 = Registry::new(Duration::from_secs(3));
    for id in ["a", "b"] {
        r2.heartbeat(worker(id, "cpu", "m"), now);
    }
    r2.kv_event(&kv("a", 1, &[1, 2], &[]));
    let cold = RouteQuery {
        model: "m".into(),
        blocks: vec![5, 6],
        ..Default::default()
    };
    assert_eq!(r2.route(&cold).unwrap(), vec!["b", "a"]);
    // Backend preference still comes first.
    r.heartbeat(worker("g", "rocm", "m"), now);
    assert_eq!(r.route(&warm).unwrap()[0], "g");
}
