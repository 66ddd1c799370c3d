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
            adapters: Vec::new(),
            kv_format: None,
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
        nats_server: String::new(),
        role: Default::default(),
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
        ..Default::default()
    };
    assert_eq!(r.route(&pinned).unwrap(), vec!["c"]);
    let pinned = RouteQuery {
        model: "m1".into(),
        backend: None,
        worker: Some("r".into()),
        ..Default::default()
    };
    assert_eq!(r.route(&pinned).unwrap(), vec!["r"]);
    let none = RouteQuery {
        model: "m1".into(),
        backend: Some("metal".into()),
        worker: None,
        ..Default::default()
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
        ..Default::default()
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
        ..Default::default()
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

fn measured(id: &str, prefill_tps: f64, service_ms: f64) -> Heartbeat {
    Heartbeat {
        status: WorkerStatus {
            capacity: 2,
            queue_capacity: 8,
            ..worker(id, "cpu", "m")
        },
        speed: switchyard_messages::WorkerSpeed {
            requests: 10,
            prefill_tps,
            service_ms,
        },
    }
}

/// Embed requests go only to workers whose model embeds; none is `no_worker`.
#[test]
fn embed_requests_go_only_to_workers_that_embed() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    let mut embeds = worker("cpu-1", "cpu", "m");
    embeds.models[0].info.embedding_dim = 576;
    r.heartbeat(embeds, now);
    r.heartbeat(worker("llama-1", "llama_cpp", "m"), now);
    let embed = RouteQuery { embed: true, ..q("m") };
    assert_eq!(r.route(&embed).unwrap(), vec!["cpu-1"]);
    assert_eq!(r.route(&q("m")).unwrap().len(), 2, "generation goes to both");
    let mut plain = worker("cpu-1", "cpu", "m");
    plain.seq = 2;
    r.heartbeat(plain, now);
    let e = r.route(&embed).unwrap_err();
    assert_eq!(e.code, ErrorCode::NoWorker, "{e:?}");
    assert!(e.message.contains("can embed"), "{}", e.message);
}

/// (1.8) An embedding-only model gets embed requests only: generation skips it, and
/// generation for a model served only that way is `bad_request`.
#[test]
fn generation_skips_embedding_only_workers() {
    let mut r = Registry::new(Duration::from_secs(3));
    let now = Instant::now();
    let mut encoder = worker("enc-1", "cpu", "m");
    encoder.models[0].info.embedding_dim = 384;
    encoder.models[0].info.embedding_only = true;
    r.heartbeat(encoder, now);
    r.heartbeat(worker("cpu-2", "cpu", "m"), now);
    let embed = RouteQuery { embed: true, ..q("m") };
    assert_eq!(r.route(&embed).unwrap(), vec!["enc-1"]);
    assert_eq!(r.route(&q("m")).unwrap(), vec!["cpu-2"], "generation skips the encoder");
    // An unnamed model: any worker that can generate.
    assert_eq!(r.route(&q("")).unwrap(), vec!["cpu-2"]);
    let mut only = worker("enc-2", "cpu", "bert");
    only.models[0].info.embedding_dim = 384;
    only.models[0].info.embedding_only = true;
    r.heartbeat(only, now);
    let e = r.route(&q("bert")).unwrap_err();
    assert_eq!(e.code, ErrorCode::BadRequest, "not a shortage: {e:?}");
    assert!(e.message.contains("embedding model"), "{}", e.message);
    assert_eq!(
        r.route(&RouteQuery {
            embed: true,
            ..q("bert")
        })
        .unwrap(),
        vec!["enc-2"]
    );
}

fn prompt(blocks: &[u64], bytes: usize) -> RouteQuery {
    RouteQuery {
        model: "m".into(),
        blocks: blocks.to_vec(),
        prompt_bytes: bytes,
        ..Default::default()
    }
}

#[test]
fn ttft_prefers_the_fast_worker_until_its_queue_costs_more() {
    let mut r = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Ttft);
    let now = Instant::now();
    // 4,000 bytes ≈ 1,000 tokens: 0.25 s on fast, 2 s on slow.
    r.heartbeat(measured("slow", 500.0, 3_000.0), now);
    r.heartbeat(measured("fast", 4_000.0, 1_000.0), now);
    let q = prompt(&[], 4_000);
    assert_eq!(r.route(&q).unwrap(), vec!["fast", "slow"]);
    // fast's 2 slots fill: still ahead while its wait (500 ms per request ahead) plus
    // 250 ms of prefill beats slow's 2 s.
    for expected in ["fast", "fast", "fast", "fast", "fast", "slow"] {
        let first = r.route(&q).unwrap()[0].clone();
        assert_eq!(first, expected);
        r.routed(&first, &[]);
    }
    // A heartbeat that says fast's queue drained brings requests back.
    let mut idle = measured("fast", 4_000.0, 1_000.0);
    idle.status.seq = 2;
    r.heartbeat(idle, now);
    assert_eq!(r.route(&q).unwrap()[0], "fast");
}

#[test]
fn ttft_weighs_warm_blocks_in_seconds() {
    let mut r = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Ttft);
    let now = Instant::now();
    r.heartbeat(measured("slow", 1_000.0, 1_000.0), now);
    r.heartbeat(measured("fast", 4_000.0, 1_000.0), now);
    let prefix: Vec<u64> = (1..=30).collect();
    r.kv_event(&kv("slow", 1, &prefix, &[]));
    // 30 of 31 blocks warm on slow: 64 tokens at 1,000/s (64 ms) beat 1,984 tokens at
    // 4,000/s (496 ms) on fast.
    let mostly_warm = prompt(&(1..=31).collect::<Vec<_>>(), 31 * 256);
    assert_eq!(r.route(&mostly_warm).unwrap()[0], "slow");
    // Warm for the first 30 of 100 blocks: 70 cold blocks cost slow 4.5 s, fast 1.6 s.
    let long = prompt(&(1..=100).collect::<Vec<_>>(), 100 * 256);
    assert_eq!(r.route(&long).unwrap()[0], "fast");
    // The block score would have sent both to the warm worker.
    let mut b = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Blocks);
    b.heartbeat(measured("slow", 1_000.0, 1_000.0), now);
    b.heartbeat(measured("fast", 4_000.0, 1_000.0), now);
    b.kv_event(&kv("slow", 1, &prefix, &[]));
    assert_eq!(b.route(&long).unwrap()[0], "slow");
}

#[test]
fn unmeasured_workers_are_predicted_at_the_median_and_none_measured_is_the_block_score() {
    let now = Instant::now();
    let mut r = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Ttft);
    let q = prompt(&[7, 8], 4_000);
    // Nobody measured: exactly the block score (backend preference first).
    r.heartbeat(worker("c", "cpu", "m"), now);
    r.heartbeat(worker("g", "rocm", "m"), now);
    r.kv_event(&kv("c", 1, &[7, 8], &[]));
    assert_eq!(r.route(&q).unwrap(), vec!["g", "c"]);
    // One measured (slow): the other is predicted at that speed, so its warm prefix
    // now counts in seconds and beats the backend preference.
    r.heartbeat(
        Heartbeat {
            status: WorkerStatus {
                seq: 2,
                ..worker("g", "rocm", "m")
            },
            speed: switchyard_messages::WorkerSpeed {
                requests: 3,
                prefill_tps: 500.0,
                service_ms: 800.0,
            },
        },
        now,
    );
    assert_eq!(r.route(&q).unwrap(), vec!["c", "g"]);
    // The same fleet under the block score keeps the backend first.
    let mut b = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Blocks);
    b.heartbeat(worker("c", "cpu", "m"), now);
    b.heartbeat(worker("g", "rocm", "m"), now);
    b.kv_event(&kv("c", 1, &[7, 8], &[]));
    assert_eq!(b.route(&q).unwrap(), vec!["g", "c"]);
}

#[test]
fn ttft_keeps_full_workers_last_and_breaks_ties_by_load_then_id() {
    let mut r = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Ttft);
    let now = Instant::now();
    let mut full = measured("a-full", 100_000.0, 10.0);
    full.status.in_flight = 2;
    full.status.queued = 8;
    r.heartbeat(full, now);
    for id in ["c", "b"] {
        r.heartbeat(measured(id, 1_000.0, 500.0), now);
    }
    let q = prompt(&[], 1_000);
    assert_eq!(r.route(&q).unwrap(), vec!["b", "c", "a-full"]);
    r.routed("b", &[]);
    assert_eq!(
        r.route(&q).unwrap(),
        vec!["c", "b", "a-full"],
        "equal predictions: less loaded first"
    );
}

#[test]
fn the_few_candidates_tried_are_the_head_of_the_full_order() {
    // A deterministic fleet with varied load, speed, backend and warm prefixes.
    let now = Instant::now();
    for policy in [RoutingPolicy::Ttft, RoutingPolicy::Blocks] {
        let mut r = Registry::with_policy(Duration::from_secs(3), policy);
        for i in 0..60u64 {
            let id = format!("w{:02}", (i * 37) % 60);
            let mut beat = measured(&id, 500.0 + (i % 7) as f64 * 300.0, 200.0 + (i % 5) as f64 * 100.0);
            beat.status.backend = ["cpu", "rocm", "llama_cpp"][(i % 3) as usize].into();
            beat.status.in_flight = (i % 4) as u32;
            if i % 11 == 0 {
                beat.speed = Default::default();
            }
            r.heartbeat(beat, now);
            let held: Vec<u64> = (1..=(i % 9)).collect();
            r.kv_event(&kv(&id, 1, &held, &[]));
        }
        // Prefixes routed since (warm before any event says so), some past what is held.
        for (i, id) in ["w03", "w17", "w42", "w08"].iter().enumerate() {
            let routed: Vec<u64> = (1..=(3 + 4 * i as u64)).collect();
            r.routed(id, &routed);
        }
        for (n, blocks) in [
            (3, vec![1, 2, 3, 4, 5]),
            (1, vec![1, 2]),
            (5, vec![]),
            (60, vec![1]),
            (2, (1..=20).collect()),
        ] {
            let q = prompt(&blocks, 2_000);
            let all = r.route(&q).unwrap();
            let top = r.route_top(&q, n).unwrap();
            assert_eq!(top.workers, all[..n], "{policy:?} top {n}");
            assert_eq!(top.warm, r.overlap(&all[0], &blocks));
        }
    }
}

#[test]
fn the_network_counts_in_predicted_ttft_and_a_new_worker_waits_for_its_probe() {
    let mut r = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Ttft);
    let now = Instant::now();
    // Two equally fast workers, one 200 ms away each way.
    r.heartbeat(measured("near", 4_000.0, 1_000.0), now);
    r.heartbeat(measured("far", 4_000.0, 1_000.0), now);
    let q = prompt(&[], 400);
    r.round_trip("near", Duration::from_millis(2));
    r.round_trip("far", Duration::from_millis(400));
    assert_eq!(r.route(&q).unwrap(), vec!["near", "far"]);
    // far takes requests once near's queue costs more than the 400 ms round trip
    // (500 ms per request ahead on near's 2 slots).
    let mut order = Vec::new();
    for _ in 0..4 {
        let first = r.route(&q).unwrap()[0].clone();
        r.routed(&first, &[]);
        order.push(first);
    }
    assert_eq!(order, ["near", "near", "far", "far"]);
    // A worker that stops answering is penalised by the time waited for it.
    let mut r2 = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Ttft);
    r2.heartbeat(measured("a", 4_000.0, 1_000.0), now);
    r2.heartbeat(measured("b", 4_000.0, 1_000.0), now);
    r2.round_trip("a", Duration::from_millis(1));
    r2.round_trip("b", Duration::from_millis(1));
    assert_eq!(r2.route(&q).unwrap()[0], "a");
    r2.round_trip("a", Duration::from_secs(2));
    assert_eq!(r2.route(&q).unwrap()[0], "b", "a's timeout moved it back");
    // Back after its heartbeats stopped: on probation until it answers (a worker seen
    // for the first time is not).
    let later = now + Duration::from_secs(4);
    let mut hb = measured("b", 4_000.0, 1_000.0);
    hb.status.seq = 2;
    r2.heartbeat(hb, later);
    r2.expire(later);
    let mut back = measured("a", 4_000.0, 1_000.0);
    back.status.seq = 3;
    r2.heartbeat(back, later);
    assert_eq!(r2.route(&q).unwrap(), vec!["b", "a"]);
    r2.round_trip("a", Duration::from_millis(1));
    assert_eq!(
        r2.route(&q).unwrap()[0],
        "a",
        "a answered its probe: back in line (a tie, to the smaller id)"
    );
}

#[test]
fn a_busy_warm_worker_loses_to_an_idle_one_that_can_pull_its_prefix() {
    let now = Instant::now();
    let format = switchyard_messages::KvFormat {
        engine: "switchyard-cpu/1".into(),
        model_sha256: "ab".into(),
        dtype: "f16".into(),
        layers: 30,
        kv_heads: 3,
        head_dim: 64,
        block_tokens: 32,
        params: String::new(),
    };
    let with = |id: &str, in_flight: u32, kv: Option<&switchyard_messages::KvFormat>| {
        let mut h = measured(id, 500.0, 4_000.0);
        h.status.in_flight = in_flight;
        h.status.models[0].kv_format = kv.cloned();
        h
    };
    // 24 blocks of a 6,144-byte document (~1,500 tokens: 3 s of prefill) held by "a",
    // whose two slots are busy (a 2 s wait); "b" is idle.
    let doc: Vec<u64> = (1..=24).collect();
    let q = prompt(&doc, 6_200);
    let mut r = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Ttft);
    r.heartbeat(with("a", 2, Some(&format)), now);
    r.heartbeat(with("b", 0, Some(&format)), now);
    r.kv_event(&kv("a", 1, &doc, &[]));
    // b pulls 24 × ~1.5 MB (0.32 s at the assumed LAN) and computes 56 bytes: first.
    assert_eq!(r.route(&q).unwrap(), vec!["b", "a"]);
    // Computing KV another way (another model file), b cannot pull: a's warm prefix
    // wins despite its wait.
    let other = switchyard_messages::KvFormat {
        model_sha256: "cd".into(),
        ..format.clone()
    };
    let mut r = Registry::with_policy(Duration::from_secs(3), RoutingPolicy::Ttft);
    r.heartbeat(with("a", 2, Some(&format)), now);
    r.heartbeat(with("b", 0, Some(&other)), now);
    r.kv_event(&kv("a", 1, &doc, &[]));
    assert_eq!(r.route(&q).unwrap(), vec!["a", "b"]);
}
