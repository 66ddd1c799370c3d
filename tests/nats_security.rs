//! switchyard under a real nats-server configured as docs/security.md says: a fleet
//! (coordinator, CPU worker, client) serves requests under user/password, token,
//! nkey, a `.creds` file (operator mode, decentralized JWT auth), TLS and mutual TLS,
//! each with certificates, keys and JWTs made in the test; and a wrong password, a
//! missing credential, a creds file of an unknown account, a corrupted or expired
//! one, an untrusted CA or a missing client certificate each fail at once with an
//! error naming the setting — never a hang, never the secret in the message.

mod common;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use switchyard::{Client, ClientOptions};
use switchyard_config::NatsSecurity;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

/// A CA, a server certificate for 127.0.0.1 signed by it, a client certificate signed
/// by it, and a second CA nobody trusts — as PEM files in `dir`.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    stranger_ca: PathBuf,
}

fn write(dir: &Path, name: &str, text: String) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    (params.self_signed(&key).unwrap(), key)
}

fn pki(dir: &Path) -> Pki {
    let (ca_cert, ca_key) = ca("switchyard test CA");
    let leaf = |sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let mut params = CertificateParams::new(sans).unwrap();
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        (params.signed_by(&key, &ca_cert, &ca_key).unwrap(), key)
    };
    let (server, server_key) = leaf(
        vec!["localhost".into(), "127.0.0.1".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client, client_key) = leaf(vec!["switchyard-client".into()], ExtendedKeyUsagePurpose::ClientAuth);
    let (stranger, _) = ca("someone else's CA");
    Pki {
        ca: write(dir, "ca.pem", ca_cert.pem()),
        server_cert: write(dir, "server.pem", server.pem()),
        server_key: write(dir, "server-key.pem", server_key.serialize_pem()),
        client_cert: write(dir, "client.pem", client.pem()),
        client_key: write(dir, "client-key.pem", client_key.serialize_pem()),
        stranger_ca: write(dir, "stranger-ca.pem", stranger.pem()),
    }
}

fn server(config: &str, dir: &Path) -> NatsServer {
    NatsServer::start_with_config(&find_nats_server("").unwrap(), config, dir).expect("nats-server starts")
}

fn with(security: &NatsSecurity, mut config: switchyard::Config) -> switchyard::Config {
    let n = &mut config.nats;
    n.user = security.user.clone();
    n.password = security.password.clone();
    n.token = security.token.clone();
    n.nkey_file = security.nkey_file.clone();
    n.creds_file = security.creds_file.clone();
    n.tls_ca_file = security.tls_ca_file.clone();
    n.tls_cert_file = security.tls_cert_file.clone();
    n.tls_key_file = security.tls_key_file.clone();
    n.tls_required = security.tls_required;
    n.inbox_prefix = security.inbox_prefix.clone();
    config.validate().expect("a valid configuration");
    config
}

async fn connect(url: &str, security: &NatsSecurity) -> Result<Client, String> {
    let opts = ClientOptions {
        security: security.clone(),
        ..ClientOptions::default()
    };
    Client::connect_with(url, opts).await.map_err(|e| e.to_string())
}

/// A coordinator and a worker (sharing `loaded`) start under `security`, a client
/// under the same gets 4 greedy tokens.
async fn fleet_serves(url: &str, security: &NatsSecurity, loaded: &switchyard::node::Loaded, what: &str) {
    let config = with(security, fleet_config(url));
    let coordinator = switchyard::node::start_coordinator(&config)
        .await
        .unwrap_or_else(|e| panic!("{what}: the coordinator connects: {e:#}"));
    let worker = switchyard::node::start_worker(&config, loaded)
        .await
        .unwrap_or_else(|e| panic!("{what}: the worker connects: {e:#}"));
    let client = connect(url, security).await.unwrap_or_else(|e| panic!("{what}: {e}"));
    wait_for_workers(&client, &["w1"], Duration::from_secs(10)).await;
    let done = client
        .generate(greedy("The capital of France is", 4))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert_eq!(done.tokens.len(), 4, "{what}");
    worker.shutdown(Duration::from_secs(2)).await;
    coordinator.shutdown().await;
}

/// Connecting fails within a few seconds, naming `setting`, never showing `secret`.
async fn refused(url: &str, security: &NatsSecurity, setting: &str, secret: &str) {
    let started = Instant::now();
    let err = connect(url, security).await.err().expect("the connection is refused");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}: {err}",
        started.elapsed()
    );
    assert!(err.contains(setting), "{err:?} does not name {setting}");
    assert!(secret.is_empty() || !err.contains(secret), "{err:?} shows the secret");
    // Processes fail the same way at start (exit non-zero, named setting).
    let config = with(security, fleet_config(url));
    let started = Instant::now();
    let err = match switchyard::node::start_coordinator(&config).await {
        Ok(_) => panic!("a coordinator connected with bad credentials"),
        Err(e) => format!("{e:#}"),
    };
    assert!(started.elapsed() < Duration::from_secs(4), "{err}");
    assert!(err.contains(setting), "{err:?} does not name {setting}");
    assert!(secret.is_empty() || !err.contains(secret), "{err:?} shows the secret");
}

fn sec() -> NatsSecurity {
    NatsSecurity::default()
}

// Operator mode (decentralized JWT authentication), with the JWTs signed here by hand
// the way nats-io/jwt v2 encodes them.

/// base64url without padding, as NATS JWTs use for all three parts.
fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A NATS v2 JWT for `subject`, signed by `issuer`: `header.claims.signature`, each
/// base64url, the signature ed25519 by the issuer's nkey over `header.claims`.
/// nats-io/jwt sets `jti` to a base32 SHA-512/256 of the claims, but nothing checks
/// it (nats-server verifies the signature, the issuer's key type, the issuer's trust
/// and the times), so a unique id does.
fn jwt(issuer: &nkeys::KeyPair, subject: &str, name: &str, exp: Option<i64>, nats: serde_json::Value) -> String {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let mut claims = json!({
        "jti": format!("SWITCHYARDTEST{}", SERIAL.fetch_add(1, Ordering::Relaxed)),
        "iat": unix_now(),
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    if let Some(exp) = exp {
        claims["exp"] = exp.into();
    }
    let header = b64(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let signed = format!("{header}.{}", b64(claims.to_string().as_bytes()));
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", b64(&signature))
}

/// The operator's self-signed JWT.
fn operator_jwt(operator: &nkeys::KeyPair) -> String {
    let nats = json!({ "type": "operator", "version": 2 });
    jwt(operator, &operator.public_key(), "switchyard-test", None, nats)
}

/// An account JWT signed by `operator`, without limits (-1 is unlimited; JetStream,
/// at 0, stays off).
fn account_jwt(operator: &nkeys::KeyPair, account: &nkeys::KeyPair) -> String {
    let nats = json!({
        "limits": {
            "subs": -1, "data": -1, "payload": -1,
            "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
        },
        "default_permissions": { "pub": {}, "sub": {} },
        "type": "account",
        "version": 2,
    });
    jwt(operator, &account.public_key(), "fleet", None, nats)
}

/// A user JWT signed by `account`, with the account's permissions and no limits.
fn user_jwt(account: &nkeys::KeyPair, user: &nkeys::KeyPair, exp: Option<i64>) -> String {
    let nats = json!({
        "pub": {}, "sub": {},
        "subs": -1, "data": -1, "payload": -1,
        "type": "user",
        "version": 2,
    });
    jwt(account, &user.public_key(), "fleet-user", exp, nats)
}

/// A `.creds` file as nsc (nats-io/jwt's `FormatUserConfig`) writes it: five dashes
/// opening each block, six closing it.
fn creds_text(user_jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// A new user of `account` (expiring at `exp`), as `dir/name`: the creds file, its
/// JWT and its seed.
fn user_creds(dir: &Path, name: &str, account: &nkeys::KeyPair, exp: Option<i64>) -> (PathBuf, String, String) {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let token = user_jwt(account, &user, exp);
    (write(dir, name, creds_text(&token, &seed)), token, seed)
}

/// nats-server configuration trusting a new operator, with one account ("fleet")
/// preloaded in a memory resolver; and that account's key pair, to sign users with.
fn operator_mode(dir: &Path) -> (String, nkeys::KeyPair) {
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let operator_file = write(dir, "operator.jwt", operator_jwt(&operator));
    let config = format!(
        "operator: \"{}\"\nresolver: MEMORY\nresolver_preload: {{\n  {}: \"{}\"\n}}",
        operator_file.display(),
        account.public_key(),
        account_jwt(&operator, &account)
    );
    (config, account)
}

fn creds(file: &Path) -> NatsSecurity {
    NatsSecurity {
        creds_file: file.display().to_string(),
        ..sec()
    }
}

/// `text` with its character at `at` replaced by another of the same alphabet.
fn damage(text: &str, at: usize) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    chars[at] = if chars[at] == 'A' { 'B' } else { 'A' };
    chars.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_serves_under_every_kind_of_credential_and_tls() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pki = pki(d);
    let mut model_cfg = fleet_config("nats://unused");
    model_cfg.worker.threads = 1;
    let loaded = switchyard::node::load(&model_cfg).await.unwrap();

    // user/password
    let s = server(
        r#"authorization { users = [ { user: "fleet", password: "pw-Z9x" } ] }"#,
        d,
    );
    let good = NatsSecurity {
        user: "fleet".into(),
        password: "pw-Z9x".into(),
        ..sec()
    };
    fleet_serves(&s.url(), &good, &loaded, "user/password").await;
    drop(s);

    // token
    let s = server(r#"authorization { token: "tok-83hd" }"#, d);
    let good = NatsSecurity {
        token: "tok-83hd".into(),
        ..sec()
    };
    fleet_serves(&s.url(), &good, &loaded, "token").await;
    drop(s);

    // nkey
    let user = nkeys::KeyPair::new_user();
    let seed_file = write(d, "user.nk", user.seed().unwrap());
    let s = server(
        &format!(r#"authorization {{ users = [ {{ nkey: "{}" }} ] }}"#, user.public_key()),
        d,
    );
    let good = NatsSecurity {
        nkey_file: seed_file.display().to_string(),
        ..sec()
    };
    fleet_serves(&s.url(), &good, &loaded, "nkey").await;
    drop(s);

    // TLS, then mutual TLS.
    let tls = format!(
        r#"tls {{ cert_file: "{}", key_file: "{}" }}"#,
        pki.server_cert.display(),
        pki.server_key.display()
    );
    let s = server(&tls, d);
    let good = NatsSecurity {
        tls_ca_file: pki.ca.display().to_string(),
        ..sec()
    };
    fleet_serves(&s.url(), &good, &loaded, "TLS").await;
    drop(s);
    let mtls = format!(
        r#"tls {{ cert_file: "{}", key_file: "{}", ca_file: "{}", verify: true }}"#,
        pki.server_cert.display(),
        pki.server_key.display(),
        pki.ca.display()
    );
    let s = server(&mtls, d);
    let good = NatsSecurity {
        tls_ca_file: pki.ca.display().to_string(),
        tls_cert_file: pki.client_cert.display().to_string(),
        tls_key_file: pki.client_key.display().to_string(),
        ..sec()
    };
    fleet_serves(&s.url(), &good, &loaded, "mutual TLS").await;
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_and_certificates_fail_fast_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pki = pki(d);

    let s = server(
        r#"authorization { users = [ { user: "fleet", password: "pw-Z9x" } ] }"#,
        d,
    );
    let wrong = NatsSecurity {
        user: "fleet".into(),
        password: "not-the-Pw-4411".into(),
        ..sec()
    };
    refused(&s.url(), &wrong, "nats.user/nats.password", "not-the-Pw-4411").await;
    refused(&s.url(), &sec(), "no credentials were given", "").await;
    drop(s);

    let s = server(r#"authorization { token: "tok-83hd" }"#, d);
    let wrong = NatsSecurity {
        token: "tok-wrong-5521".into(),
        ..sec()
    };
    refused(&s.url(), &wrong, "nats.token", "tok-wrong-5521").await;
    drop(s);

    let tls = format!(
        r#"tls {{ cert_file: "{}", key_file: "{}", ca_file: "{}", verify: true }}"#,
        pki.server_cert.display(),
        pki.server_key.display(),
        pki.ca.display()
    );
    let s = server(&tls, d);
    let untrusted = NatsSecurity {
        tls_ca_file: pki.stranger_ca.display().to_string(),
        tls_cert_file: pki.client_cert.display().to_string(),
        tls_key_file: pki.client_key.display().to_string(),
        ..sec()
    };
    refused(&s.url(), &untrusted, "nats.tls_ca_file", "").await;
    let no_client_cert = NatsSecurity {
        tls_ca_file: pki.ca.display().to_string(),
        ..sec()
    };
    refused(&s.url(), &no_client_cert, "nats.tls_cert_file", "").await;
    let plain = sec();
    refused(&s.url(), &plain, "TLS", "").await;
    drop(s);

    // The CLI exits non-zero at once with the setting named, and the secret stays out.
    let s = server(
        r#"authorization { users = [ { user: "fleet", password: "pw-Z9x" } ] }"#,
        d,
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["--nats", &s.url(), "--nats-user", "fleet", "status"])
        .env("SWITCHYARD_NATS_PASSWORD", "not-the-Pw-4411")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("nats.user/nats.password"), "{stderr}");
    assert!(!stderr.contains("not-the-Pw-4411"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_serves_under_a_creds_file_in_operator_mode() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (config, account) = operator_mode(d);
    let s = server(&config, d);
    let (file, _, _) = user_creds(d, "fleet.creds", &account, Some(unix_now() + 3600));
    let mut model_cfg = fleet_config("nats://unused");
    model_cfg.worker.threads = 1;
    let loaded = switchyard::node::load(&model_cfg).await.unwrap();
    fleet_serves(&s.url(), &creds(&file), &loaded, "creds (operator mode)").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_corrupted_or_expired_creds_fail_fast_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (config, account) = operator_mode(d);
    let s = server(&config, d);
    let url = s.url();

    // A user of an account the server was never given.
    let stranger = nkeys::KeyPair::new_account();
    let (file, _, seed) = user_creds(d, "stranger.creds", &stranger, None);
    refused(&url, &creds(&file), "nats.creds_file", &seed).await;

    // A user whose JWT expired a minute ago.
    let (file, _, seed) = user_creds(d, "expired.creds", &account, Some(unix_now() - 60));
    refused(&url, &creds(&file), "nats.creds_file", &seed).await;

    // A good user's file with one character of the seed changed: it no longer parses
    // (checksum), and the message shows neither seed.
    let (good, token, seed) = user_creds(d, "good.creds", &account, None);
    let text = std::fs::read_to_string(&good).unwrap();
    let bad_seed = damage(&seed, seed.len() / 2);
    let file = write(d, "bad-seed.creds", text.replace(&seed, &bad_seed));
    refused(&url, &creds(&file), "nats.creds_file", &bad_seed).await;
    refused(&url, &creds(&file), "nats.creds_file", &seed).await;

    // ... with one character of the JWT's signature changed: the server refuses it.
    let bad_token = damage(&token, token.len() - 20);
    let file = write(d, "bad-jwt.creds", text.replace(&token, &bad_token));
    refused(&url, &creds(&file), "nats.creds_file", &seed).await;

    // ... cut short after the JWT: no seed block.
    let cut = text.split("************").next().unwrap().to_string();
    let file = write(d, "no-seed.creds", cut);
    refused(&url, &creds(&file), "nats.creds_file", &seed).await;

    // The good file still connects (the server was fine all along).
    connect(&url, &creds(&good))
        .await
        .expect("the untouched creds file connects");

    // The CLI exits non-zero at once with the setting named, and the seed stays out.
    let started = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["--nats", &url, "--nats-creds-file"])
        .arg(d.join("bad-seed.creds"))
        .arg("status")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(4), "{stderr}");
    assert!(stderr.contains("nats.creds_file"), "{stderr}");
    assert!(!stderr.contains(&bad_seed) && !stderr.contains(&seed), "{stderr}");
}
