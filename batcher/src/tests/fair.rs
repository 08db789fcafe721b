//! Fair share between tenants: batches split by weight under contention, a tenant alone takes
//! everything, a light tenant is served next, and a full queue sheds the heaviest tenant.

use std::collections::HashMap;

use super::*;
use crate::Share;

fn tenant(name: &str, weight: u32) -> Share {
    Share {
        tenant: name.into(),
        weight,
        scope: name.into(),
    }
}

/// Submits `text` as a one-input request of `share` with `options` and a far deadline.
fn submit_one(
    batcher: &BatcherHandle,
    share: &Share,
    text: String,
    options: EmbedOptions,
) -> oneshot::Receiver<Outcome> {
    batcher
        .submit_as(
            share.clone(),
            (vec![Input::from(text)], vec![1]),
            options,
            far(),
        )
        .expect("accepted")
}

/// Offers `text` as a one-input request of `share` with default options and a far deadline,
/// refused at once when the queue has no room for it (`try_submit_as`).
async fn offer(
    batcher: &BatcherHandle,
    share: Share,
    text: impl Into<String>,
) -> Result<oneshot::Receiver<Outcome>, crate::Refused> {
    batcher
        .try_submit_as(
            share,
            (vec![Input::from(text.into())], vec![1]),
            EmbedOptions::default(),
            far(),
        )
        .await
}

/// Inputs of each call by the prefix of their text (`a7` counts for `a`).
fn split_by_prefix(calls: &[(Vec<String>, EmbedOptions)]) -> Vec<HashMap<char, usize>> {
    calls
        .iter()
        .map(|(inputs, _)| {
            let mut counts = HashMap::new();
            for input in inputs {
                if let Some(first) = input.chars().next() {
                    *counts.entry(first).or_default() += 1;
                }
            }
            counts
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn two_backlogged_tenants_split_the_batches_by_weight() {
    // One call at a time, 30 inputs each, 10 ms: both tenants keep far more than a batch
    // waiting, a of weight 2 and b of weight 1.
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config(30, 5, 1));
    let (a, b) = (tenant("a", 2), tenant("b", 1));
    let mut receivers = Vec::new();
    for i in 0..600 {
        receivers.push(submit_one(
            &batcher,
            &a,
            format!("a{i}"),
            EmbedOptions::default(),
        ));
        receivers.push(submit_one(
            &batcher,
            &b,
            format!("b{i}"),
            EmbedOptions::default(),
        ));
    }
    for rx in receivers {
        outcome(rx).await.expect("ok");
    }
    let calls = upstream.calls();
    // While both wait: the first 20 calls (600 inputs; b alone has 600).
    let both: Vec<_> = split_by_prefix(&calls[..20]);
    let (sum_a, sum_b) = both.iter().fold((0, 0), |(sa, sb), c| {
        (
            sa + c.get(&'a').copied().unwrap_or(0),
            sb + c.get(&'b').copied().unwrap_or(0),
        )
    });
    let ratio = sum_a as f64 / sum_b as f64;
    assert!(
        (1.8..=2.2).contains(&ratio),
        "a:b = {sum_a}:{sum_b} = {ratio:.2} over the contended calls"
    );
    assert!(
        calls
            .iter()
            .all(|(inputs, _)| inputs.len() == 30 || inputs.len() < 30)
    );
    assert_eq!(calls.iter().map(|(i, _)| i.len()).sum::<usize>(), 1200);
}

#[tokio::test(start_paused = true)]
async fn a_tenant_alone_gets_full_batches() {
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config(10, 5, 1));
    let a = tenant("a", 1);
    let receivers: Vec<_> = (0..100)
        .map(|i| submit_one(&batcher, &a, format!("a{i}"), EmbedOptions::default()))
        .collect();
    for rx in receivers {
        outcome(rx).await.expect("ok");
    }
    let sizes: Vec<usize> = upstream.calls().iter().map(|(i, _)| i.len()).collect();
    assert_eq!(sizes, [10; 10], "work-conserving: every batch full");
}

/// A heavy tenant with a backlog of 300 one-input requests; 1 ms after its first call starts,
/// a light tenant's one request with `options`. The calls made.
async fn light_behind_heavy(concurrent: usize, options: EmbedOptions) -> Vec<Vec<String>> {
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config(10, 5, concurrent));
    let heavy = tenant("heavy", 1);
    let backlog: Vec<_> = (0..300)
        .map(|i| submit_one(&batcher, &heavy, format!("h{i}"), EmbedOptions::default()))
        .collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let started = upstream.calls().len();
    assert_eq!(started, concurrent, "the heavy tenant's first calls run");
    let light = submit_one(&batcher, &tenant("light", 1), "light".into(), options);
    outcome(light).await.expect("ok");
    for rx in backlog {
        outcome(rx).await.expect("ok");
    }
    upstream.calls().into_iter().map(|(i, _)| i).collect()
}

#[tokio::test(start_paused = true)]
async fn a_light_tenant_behind_a_heavy_backlog_goes_in_the_next_batch() {
    let calls = light_behind_heavy(1, EmbedOptions::default()).await;
    let at = calls.iter().position(|c| c.contains(&"light".to_string()));
    assert_eq!(at, Some(1), "the batch after the one running");
}

#[tokio::test(start_paused = true)]
async fn a_light_tenant_with_other_options_is_not_passed_over_by_full_batches() {
    // Two slots, the last for full batches: without the fair share, the heavy tenant's full
    // batches would take every slot until its backlog is gone (30 calls).
    let other = EmbedOptions {
        normalize: false,
        ..EmbedOptions::default()
    };
    let calls = light_behind_heavy(2, other).await;
    let at = calls
        .iter()
        .position(|c| c == &vec!["light".to_string()])
        .expect("sent alone (its own options)");
    assert!(at <= 3, "call {at}: once a slot frees after MAX_WAIT_TIME");
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_sheds_the_tenant_furthest_over_its_share() {
    let cfg = config(2, 5, 1).with_queue_cap(10);
    let (_upstream, batcher, _task) = start(Duration::from_secs(1), cfg);
    let heavy = tenant("heavy", 1);
    let held: Vec<_> = (0..10)
        .map(|i| submit_one(&batcher, &heavy, format!("h{i}"), EmbedOptions::default()))
        .collect();
    tokio::time::sleep(Duration::from_millis(1)).await;
    let err = offer(&batcher, heavy.clone(), "h10")
        .await
        .expect_err("the heavy tenant's own request finds the queue full");
    assert_eq!(err.error.status(), 429);
    let light = offer(&batcher, tenant("light", 1), "light")
        .await
        .expect("a tenant under its share makes room");
    let mut outcomes = Vec::new();
    for rx in held {
        outcomes.push(outcome(rx).await);
    }
    let shed: Vec<usize> = (0..10).filter(|&i| outcomes[i].is_err()).collect();
    assert_eq!(shed, [9], "the heavy tenant's newest queued request");
    let err = outcomes[9].as_ref().expect_err("shed");
    assert_eq!(err.status(), 429);
    assert!(err.to_string().contains("`heavy`"), "{err}");
    outcome(light).await.expect("served");
}

#[tokio::test(start_paused = true)]
async fn the_queue_delay_bound_sheds_a_backlogged_tenant_not_a_light_one() {
    // 4 inputs per 10 ms call, one at a time, at most 30 ms of queue ahead.
    let cfg = config(4, 0, 1).with_max_queue_delay(QueueDelay::Fixed(Duration::from_millis(30)));
    let (_upstream, batcher, _task) = start(Duration::from_millis(10), cfg);
    let heavy = tenant("heavy", 1);
    let first = submit_one(&batcher, &heavy, "warm".into(), EmbedOptions::default());
    outcome(first).await.expect("measures the call time");
    let mut refused = 0;
    let mut held = Vec::new();
    for i in 0..40 {
        match offer(&batcher, heavy.clone(), format!("h{i}")).await {
            Ok(rx) => held.push(rx),
            Err(refusal) => {
                assert_eq!(refusal.error.status(), 429);
                refused += 1;
            }
        }
    }
    assert!(
        refused > 20,
        "the heavy tenant's own backlog bounds it: {refused} shed"
    );
    let light = offer(&batcher, tenant("light", 1), "light")
        .await
        .expect("only its share of the heavy backlog is ahead of it");
    outcome(light).await.expect("ok");
    for rx in held {
        outcome(rx).await.expect("ok");
    }
}

#[tokio::test(start_paused = true)]
async fn tenants_waiting_in_a_partial_batch_keep_the_batching_rules() {
    // Two slots, the last for full batches: a partial batch of two tenants, due by
    // MAX_WAIT_TIME while a call runs, keeps filling until that call ends, as with one tenant.
    let (upstream, batcher, _task) = start(Duration::from_millis(10), config(10, 5, 2));
    let (a, b) = (tenant("a", 1), tenant("b", 1));
    let first: Vec<_> = (0..10)
        .map(|i| submit_one(&batcher, &a, format!("a{i}"), EmbedOptions::default()))
        .collect();
    let mut later = vec![
        submit_one(&batcher, &a, "a-late".into(), EmbedOptions::default()),
        submit_one(&batcher, &b, "b-late".into(), EmbedOptions::default()),
    ];
    // Past MAX_WAIT_TIME, an arrival makes the batcher look again.
    tokio::time::sleep(Duration::from_millis(6)).await;
    later.push(submit_one(
        &batcher,
        &b,
        "b-later".into(),
        EmbedOptions::default(),
    ));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(
        upstream.calls().len(),
        1,
        "no partial batch into the last slot"
    );
    for rx in first.into_iter().chain(later) {
        outcome(rx).await.expect("ok");
    }
    let sizes: Vec<usize> = upstream.calls().iter().map(|(i, _)| i.len()).collect();
    assert_eq!(sizes, [10, 3]);
}
