use super::*;
use std::io::Write;

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[test]
fn defaults_are_valid() {
    let c = Config::load(None, vars(&[])).unwrap();
    assert_eq!(c, Config::default());
    c.validate().unwrap();
}

#[test]
fn file_then_env_override_in_order() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[worker]\ncapacity = 2\nqueue_depth = 5\n[nats]\nprefix = \"t1\"").unwrap();
    let c = Config::load(
        Some(f.path()),
        vars(&[("SWITCHYARD_WORKER_CAPACITY", "3"), ("SWITCHYARD_CACHE", "/x")]),
    )
    .unwrap();
    assert_eq!(c.worker.capacity, 3, "env beats file");
    assert_eq!(c.worker.queue_depth, 5, "file beats default");
    assert_eq!(c.nats.prefix, "t1");
}

#[test]
fn unknown_key_in_file_names_it_and_the_file() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[worker]\ncapacityy = 2").unwrap();
    let err = Config::load(Some(f.path()), vars(&[])).unwrap_err().to_string();
    assert!(err.contains("capacityy"), "{err}");
    assert!(err.contains(&f.path().display().to_string()), "{err}");
}

#[test]
fn gpu_allow_cpu_is_also_read_under_its_old_name_rocm_allow_cpu() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[worker]\nrocm_allow_cpu = true").unwrap();
    assert!(Config::load(Some(f.path()), vars(&[])).unwrap().worker.gpu_allow_cpu);
    let c = Config::load(None, vars(&[("SWITCHYARD_WORKER_ROCM_ALLOW_CPU", "1")])).unwrap();
    assert!(c.worker.gpu_allow_cpu);
    let c = Config::load(None, vars(&[("SWITCHYARD_WORKER_GPU_ALLOW_CPU", "yes")])).unwrap();
    assert!(c.worker.gpu_allow_cpu);
    // Both names at once is ambiguous, and named.
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[worker]\nrocm_allow_cpu = true\ngpu_allow_cpu = false").unwrap();
    let err = Config::load(Some(f.path()), vars(&[])).unwrap_err().to_string();
    assert!(err.contains("gpu_allow_cpu"), "{err}");
}

#[test]
fn wrong_type_in_env_names_the_variable() {
    let err = Config::load(None, vars(&[("SWITCHYARD_WORKER_CAPACITY", "many")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("SWITCHYARD_WORKER_CAPACITY"), "{err}");
}

#[test]
fn invalid_values_name_the_field() {
    let mut c = Config::default();
    c.worker.capacity = 0;
    c.validate().expect("capacity 0 = the backend's own");
    c.worker.backend = "tpu".into();
    assert!(c.validate().unwrap_err().to_string().contains("worker.backend"));
    c.worker.backend = "cuda".into();
    c.validate().expect("cuda is a backend");
    c.worker.backend = "llama_cpp".into();
    assert!(c.validate().unwrap_err().to_string().contains("worker.llama_url"));
    c.worker.llama_url = "http://127.0.0.1:8080".into();
    c.validate().expect("llama_cpp with a URL");
    c.worker.backend = "rocm".into();
    c.worker.gpu_layers = -2;
    assert!(c.validate().unwrap_err().to_string().contains("worker.gpu_layers"));
    let mut c = Config::default();
    c.nats.prefix = "a.b".into();
    assert!(c.validate().unwrap_err().to_string().contains("nats.prefix"));
    let mut c = Config::default();
    c.worker.pooling = "max".into();
    assert!(c.validate().unwrap_err().to_string().contains("worker.pooling"));
    c.worker.pooling = "last".into();
    c.validate().expect("last-token pooling");
    let mut c = Config::default();
    c.worker.async_threads = 2000;
    assert!(c.validate().unwrap_err().to_string().contains("worker.async_threads"));
    let mut c = Config::default();
    c.coordinator.worker_expiry_ms = 10;
    assert!(c
        .validate()
        .unwrap_err()
        .to_string()
        .contains("coordinator.worker_expiry_ms"));
}

#[test]
fn nats_secrets_never_show_in_debug_and_one_auth_method_at_a_time() {
    let mut c = Config::default();
    c.nats.user = "fleet".into();
    c.nats.password = "hunter2-secret".into();
    let shown = format!("{c:?}");
    assert!(
        !shown.contains("hunter2-secret") && shown.contains("<redacted>"),
        "{shown}"
    );
    c.validate().unwrap();

    c.nats.token = "tok-secret".into();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("nats.token") && e.contains("nats.user/nats.password"), "{e}");
    assert!(!e.contains("tok-secret") && !e.contains("hunter2-secret"), "{e}");

    let mut c = Config::default();
    c.nats.user = "fleet".into();
    assert!(c.validate().unwrap_err().to_string().contains("nats.user"));
    let mut c = Config::default();
    c.nats.tls_cert_file = "/etc/hostname".into();
    assert!(c.validate().unwrap_err().to_string().contains("nats.tls_cert_file"));
    let mut c = Config::default();
    c.nats.tls_ca_file = "/no/such/ca.pem".into();
    assert!(c.validate().unwrap_err().to_string().contains("nats.tls_ca_file"));
    let mut c = Config::default();
    c.nats.inbox_prefix = "_INBOX.alice".into();
    c.validate().unwrap();
    c.nats.inbox_prefix = "_INBOX.*".into();
    assert!(c.validate().unwrap_err().to_string().contains("nats.inbox_prefix"));
}

#[test]
fn nats_security_comes_from_the_environment() {
    let vars = [
        ("SWITCHYARD_NATS_USER", "fleet"),
        ("SWITCHYARD_NATS_PASSWORD", "pw"),
        ("SWITCHYARD_NATS_TLS_REQUIRED", "true"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let c = Config::load(None, vars).unwrap();
    let s = c.nats.security();
    assert_eq!(
        (s.user.as_str(), s.password.as_str(), s.tls_required),
        ("fleet", "pw", true)
    );
    assert!(s.tls());
}

#[test]
fn routing_policy_from_file_and_env_and_a_bad_one_named() {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[coordinator]\nrouting = \"blocks\"").unwrap();
    let c = Config::load(Some(f.path()), vars(&[])).unwrap();
    assert_eq!(c.coordinator.routing, RoutingPolicy::Blocks);
    assert_eq!(Config::default().coordinator.routing, RoutingPolicy::Ttft);
    let c = Config::load(None, vars(&[("SWITCHYARD_COORDINATOR_ROUTING", "blocks")])).unwrap();
    assert_eq!(c.coordinator.routing, RoutingPolicy::Blocks);
    let err = Config::load(None, vars(&[("SWITCHYARD_COORDINATOR_ROUTING", "fastest")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("coordinator.routing") && err.contains("fastest"), "{err}");
    let mut f = tempfile::NamedTempFile::new().unwrap();
    writeln!(f, "[coordinator]\nrouting = \"fastest\"").unwrap();
    let err = Config::load(Some(f.path()), vars(&[])).unwrap_err().to_string();
    assert!(
        err.contains("routing") && err.contains(&f.path().display().to_string()),
        "{err}"
    );
}
