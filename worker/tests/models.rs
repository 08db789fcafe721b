//! Many models under one subject prefix (contract v1.1), over a real nats-server with TEI
//! doubles announcing different `model_id`s: each worker answers its model subject, the default
//! model also the plain subject, and a worker never receives another model's requests.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::embed_status;
use embatch_client::{EmbedClient, RequestError};
use embatch_protocol::model::model_subject;
use embatch_testkit::{NatsServer, RunningWorker, TeiConfig, TeiDouble, double_vector, start_tei};

/// A TEI double whose `/info` names `model_id`.
async fn tei_of(model_id: &str) -> TeiDouble {
    start_tei(TeiConfig {
        model_id: model_id.into(),
        ..TeiConfig::instant()
    })
    .await
}

/// What a request for `text` through `client` answers: its status and body.
async fn embed(client: &EmbedClient, text: &str) -> (u16, serde_json::Value) {
    let body = serde_json::json!({ "inputs": text }).to_string();
    embed_status(client, Bytes::from(body)).await
}

/// The texts `tei` was called with, in order.
fn texts_of(tei: &TeiDouble) -> Vec<String> {
    tei.calls()
        .iter()
        .flat_map(|c| c.inputs.iter().map(|i| format!("{i:?}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_model_is_served_on_its_own_subject_and_the_default_on_the_plain_one() {
    let nats = NatsServer::start();
    let (tei_a, tei_b) = (tei_of("org/model-a.v1").await, tei_of("model-b").await);
    let default = ["--default-model", "org/model-a.v1"];
    let a = RunningWorker::start(
        &nats,
        &[&["--tei-url", tei_a.url.as_str()], &default[..]].concat(),
    )
    .await;
    let b = RunningWorker::start(
        &nats,
        &[&["--tei-url", tei_b.url.as_str()], &default[..]].concat(),
    )
    .await;
    let nats_client = async_nats::connect(nats.url()).await.expect("connects");

    let for_b = EmbedClient::for_model(nats_client.clone(), "embed", "model-b");
    assert_eq!(for_b.subject(), "embed.model-b");
    let for_a = EmbedClient::for_model(nats_client.clone(), "embed", "org/model-a.v1");
    assert_eq!(for_a.subject(), "embed.org/model-a%2Ev1");
    let plain = EmbedClient::new(nats_client.clone(), "embed");
    for i in 0..20 {
        let (code, body) = embed(&for_b, &format!("for b {i}")).await;
        assert_eq!(code, 200, "{body}");
        let vector: Vec<Vec<f32>> = serde_json::from_value(body).expect("vectors");
        assert_eq!(vector, vec![double_vector(&format!("for b {i}"))]);
        assert_eq!(embed(&for_a, &format!("for a {i}")).await.0, 200);
        // A v1 client on the plain subject reaches the default model only.
        assert_eq!(embed(&plain, &format!("plain {i}")).await.0, 200);
    }
    let (on_a, on_b) = (texts_of(&tei_a), texts_of(&tei_b));
    assert_eq!(on_b.len(), 20, "every request for b reached b: {on_b:?}");
    assert!(
        on_b.iter().all(|t| t.contains("for b")),
        "b got another model's request: {on_b:?}"
    );
    assert_eq!(on_a.len(), 40, "{on_a:?}");
    assert!(
        on_a.iter().all(|t| !t.contains("for b")),
        "a got b's request: {on_a:?}"
    );

    // `info` on a model subject describes that model.
    let info = for_b.info(Duration::from_secs(5)).await.expect("b's info");
    let info: serde_json::Value = serde_json::from_slice(&info.payload).expect("JSON");
    assert_eq!(info["model_id"], "model-b");
    let info = plain
        .info(Duration::from_secs(5))
        .await
        .expect("the default's info");
    let info: serde_json::Value = serde_json::from_slice(&info.payload).expect("JSON");
    assert_eq!(info["model_id"], "org/model-a.v1");

    // A model nobody serves has no responders (the gateway answers 404 before asking).
    let none = EmbedClient::for_model(nats_client.clone(), "embed", "nobody");
    let err = none
        .embed(
            Bytes::from_static(br#"{"inputs":"x"}"#),
            Duration::from_secs(2),
        )
        .await
        .expect_err("no worker of that model");
    assert!(matches!(err, RequestError::NoResponders { .. }), "{err}");

    // Discovery lists both models, and which answers the plain subject.
    let mut found = embatch_client::models::discover(
        &nats_client,
        embatch_protocol::SERVICE_NAME,
        "embed",
        Duration::from_millis(500),
    )
    .await
    .expect("discovery");
    found.sort_by(|x, y| x.model.cmp(&y.model));
    let models: Vec<_> = found
        .iter()
        .map(|w| (w.model.as_deref(), w.plain))
        .collect();
    assert_eq!(
        models,
        [(Some("model-b"), false), (Some("org/model-a.v1"), true)]
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_alias_names_the_model_and_a_reserved_name_refuses_to_start() {
    use clap::Parser;
    let nats = NatsServer::start();
    let tei = tei_of("org/long-model-name").await;
    let worker = RunningWorker::start(
        &nats,
        &["--tei-url", tei.url.as_str(), "--model-alias", "small"],
    )
    .await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    let small = EmbedClient::for_model(client.clone(), "embed", "small");
    assert_eq!(embed(&small, "hello").await.0, 200);
    let by_id = EmbedClient::for_model(client.clone(), "embed", "org/long-model-name");
    assert!(
        by_id
            .embed(
                Bytes::from_static(br#"{"inputs":"x"}"#),
                Duration::from_secs(1)
            )
            .await
            .is_err(),
        "the alias replaces the id"
    );
    worker.stop().await;

    let argv = [
        "embatch-worker",
        "--nats-url",
        &nats.url(),
        "--metrics-addr",
        "",
        "--tei-url",
        tei.url.as_str(),
        "--model-alias",
        "cancel",
    ];
    let config = embatch_worker::Config::parse_from(argv);
    let nats_client = embatch_worker::connect(&config).await.expect("connects");
    let upstream = embatch_worker::build_upstream(&config)
        .await
        .expect("upstream");
    let err = embatch_worker::run(nats_client, upstream, &config, std::future::pending())
        .await
        .expect_err("`cancel` is the plain subject's cancel subject");
    assert!(err.to_string().contains("MODEL_ALIAS"), "{err}");
    assert!(
        model_subject("embed", "cancel") == "embed.cancel",
        "the collision the check prevents"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_given_up_on_a_model_subject_is_withdrawn_there() {
    let nats = NatsServer::start();
    // One call at a time, one input per call, 600 ms each: a second request waits in the queue.
    let tei = start_tei(TeiConfig {
        model_id: "model-b".into(),
        base: Duration::from_millis(600),
        ..TeiConfig::instant()
    })
    .await;
    let mut args = vec!["--tei-url", tei.url.as_str()];
    args.extend(embatch_testkit::ONE_CALL_AT_A_TIME);
    let worker = RunningWorker::start(&nats, &args).await;
    let client = async_nats::connect(nats.url()).await.expect("connects");
    let for_b = EmbedClient::for_model(client, "embed", "model-b");

    let first = {
        let for_b = for_b.clone();
        tokio::spawn(async move { embed(&for_b, "occupies the upstream").await })
    };
    for _ in 0..500 {
        if !tei.calls().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        !tei.calls().is_empty(),
        "the first request reached the upstream"
    );
    // The caller goes away while its request is queued (its future is dropped): the client
    // withdraws it on `embed.model-b.cancel`, which the worker listens to. (Its deadline, 10 s,
    // is far off: only the withdrawal keeps it from the upstream.)
    let gave_up = tokio::time::timeout(
        Duration::from_millis(150),
        for_b.embed(
            Bytes::from_static(br#"{"inputs":"the caller gives up"}"#),
            Duration::from_secs(10),
        ),
    )
    .await;
    assert!(gave_up.is_err(), "the caller stopped waiting: {gave_up:?}");
    assert_eq!(first.await.expect("joins").0, 200);
    assert_eq!(embed(&for_b, "after").await.0, 200);
    let inputs: Vec<String> = texts_of(&tei);
    assert_eq!(
        inputs,
        [r#"Text("occupies the upstream")"#, r#"Text("after")"#],
        "the withdrawn request never reached the upstream"
    );
    worker.stop().await;
}
