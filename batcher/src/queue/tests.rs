//! The queue's batch formation, expiry and removal, on plain data.
use super::*;
use crate::fastest::Fastest;

/// Pushes a request whose inputs all count 1 token (count batching).
fn push(
    queue: &mut Queue,
    id: u64,
    inputs: Vec<Input>,
    options: EmbedOptions,
    accepted: Instant,
    deadline: Instant,
) {
    let lengths = vec![1; inputs.len()];
    queue.push(
        id,
        Arrival {
            inputs,
            lengths,
            options,
            share: Share::default(),
            accepted,
            deadline,
        },
    );
}

/// [`push`] with the default options.
fn push_plain(
    queue: &mut Queue,
    id: u64,
    inputs: Vec<Input>,
    accepted: Instant,
    deadline: Instant,
) {
    push(
        queue,
        id,
        inputs,
        EmbedOptions::default(),
        accepted,
        deadline,
    );
}

/// The request of each segment of `formed`, in order.
fn requests(formed: &Formed) -> Vec<u64> {
    formed.segments.iter().map(|s| s.request).collect()
}

fn take(now: Instant, batch_limit: usize) -> Take {
    Take {
        now,
        batch_limit,
        budget: TokenBudget::default(),
        max_wait: Duration::from_millis(5),
        flush_all: false,
        partial: true,
        cutoff: now,
        probe_allowed: false,
        floor: Fastest::default(),
    }
}

fn texts(prefix: &str, n: usize) -> Vec<Input> {
    (0..n)
        .map(|i| Input::from(format!("{prefix}{i}")))
        .collect()
}

#[test]
fn a_group_is_due_when_full_or_when_its_head_waited_max_wait() {
    let t0 = Instant::now();
    let mut queue = Queue::default();
    push_plain(
        &mut queue,
        1,
        texts("a", 2),
        t0,
        t0 + Duration::from_secs(9),
    );
    assert!(queue.take(take(t0, 4)).is_none(), "neither full nor due");
    assert_eq!(
        queue.next_due(Duration::from_millis(5)),
        Some(t0 + Duration::from_millis(5) - TIMER_SLACK)
    );
    let formed = queue
        .take(take(t0 + Duration::from_millis(5), 4))
        .expect("due");
    assert_eq!(formed.inputs, texts("a", 2));
    assert_eq!(queue.inputs(), 0);
    assert_eq!(queue.next_due(Duration::from_millis(5)), None);
}

#[test]
fn a_large_request_is_split_into_segments_and_options_never_mix() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(9);
    let other = EmbedOptions {
        normalize: false,
        ..EmbedOptions::default()
    };
    let mut queue = Queue::default();
    push_plain(&mut queue, 1, texts("a", 3), t0, far);
    push(&mut queue, 2, texts("b", 1), other.clone(), t0, far);
    push_plain(&mut queue, 3, texts("c", 3), t0, far);
    let first = queue.take(take(t0, 4)).expect("full group");
    assert_eq!(first.options, EmbedOptions::default());
    assert_eq!(first.inputs, ["a0", "a1", "a2", "c0"]);
    assert_eq!(
        first.segments,
        [
            Segment {
                request: 1,
                indices: vec![0, 1, 2],
                at: 0,
                len: 3,
                scope: "default".into()
            },
            Segment {
                request: 3,
                indices: vec![0],
                at: 3,
                len: 1,
                scope: "default".into()
            },
        ]
    );
    let all = Take {
        flush_all: true,
        ..take(t0, 4)
    };
    let mut rest = [
        queue.take(all.clone()).expect("flush"),
        queue.take(all.clone()).expect("flush"),
    ];
    rest.sort_by_key(|f| f.inputs.len());
    assert_eq!(rest[0].options, other);
    assert_eq!(rest[1].inputs, ["c1", "c2"]);
    assert_eq!(
        rest[1].segments[0],
        Segment {
            request: 3,
            indices: vec![1, 2],
            at: 0,
            len: 2,
            scope: "default".into()
        }
    );
    assert!(queue.take(all.clone()).is_none());
}

#[test]
fn requests_that_cannot_finish_in_time_expire_unless_one_may_probe() {
    let t0 = Instant::now();
    let mut queue = Queue::default();
    for id in 0..3 {
        push_plain(
            &mut queue,
            id,
            texts("x", 1),
            t0,
            t0 + Duration::from_millis(50),
        );
    }
    push_plain(
        &mut queue,
        3,
        texts("ok", 1),
        t0,
        t0 + Duration::from_secs(9),
    );
    let formed = queue
        .take(Take {
            cutoff: t0 + Duration::from_millis(100),
            probe_allowed: true,
            flush_all: true,
            ..take(t0, 8)
        })
        .expect("due");
    assert!(formed.probe);
    assert_eq!(requests(&formed), [0, 3]);
    assert_eq!(
        formed.expired,
        [
            (
                1,
                Removed {
                    inputs: 1,
                    tokens: 1
                }
            ),
            (
                2,
                Removed {
                    inputs: 1,
                    tokens: 1
                }
            )
        ]
    );
    assert_eq!(queue.inputs(), 0);
}

#[test]
fn a_request_due_before_the_fastest_call_expires_even_when_a_probe_is_allowed() {
    let t0 = Instant::now();
    let mut queue = Queue::default();
    // Due in 5 ms and in 50 ms; the fastest one-input call lately took 22 ms.
    for (id, due) in [(0, 5), (1, 50)] {
        push_plain(
            &mut queue,
            id,
            texts("x", 1),
            t0,
            t0 + Duration::from_millis(due),
        );
    }
    let mut floor = Fastest::default();
    floor.record(Duration::from_millis(22), 1, 1, t0);
    floor.record(Duration::from_millis(23), 1, 1, t0);
    let formed = queue
        .take(Take {
            probe_allowed: true,
            flush_all: true,
            floor,
            ..take(t0, 8)
        })
        .expect("due");
    assert!(!formed.probe, "the hopeless request is no probe");
    assert_eq!(requests(&formed), [1]);
    assert_eq!(
        formed.expired,
        [(
            0,
            Removed {
                inputs: 1,
                tokens: 1
            }
        )]
    );
}

#[test]
fn expiry_follows_the_earliest_deadline_and_skips_requests_that_left() {
    let t0 = Instant::now();
    let at = |ms| t0 + Duration::from_millis(ms);
    let mut queue = Queue::default();
    push_plain(&mut queue, 1, texts("a", 1), t0, at(300));
    push_plain(&mut queue, 2, texts("b", 2), t0, at(100));
    push_plain(&mut queue, 3, texts("c", 1), t0, at(200));
    assert_eq!(queue.next_deadline(), Some(at(100)));
    assert_eq!(queue.remove(2).inputs, 2);
    assert_eq!(
        queue.next_deadline(),
        Some(at(200)),
        "a removed request is skipped"
    );
    assert!(queue.expire(at(199)).is_empty());
    assert_eq!(
        queue
            .expire(at(300))
            .iter()
            .map(|(id, removed)| (*id, removed.inputs))
            .collect::<Vec<_>>(),
        [(3, 1), (1, 1)]
    );
    assert_eq!(queue.inputs(), 0);
    assert_eq!(queue.next_deadline(), None);
    assert!(
        queue
            .take(Take {
                flush_all: true,
                ..take(t0, 8)
            })
            .is_none()
    );
}

#[test]
fn a_group_whose_head_left_is_due_by_its_next_request() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(9);
    let mut queue = Queue::default();
    push_plain(&mut queue, 1, texts("a", 1), t0, far);
    let later = t0 + Duration::from_millis(3);
    push_plain(&mut queue, 2, texts("b", 1), later, far);
    queue.remove(1);
    assert_eq!(
        queue.next_due(Duration::from_millis(5)),
        Some(later + Duration::from_millis(5) - TIMER_SLACK)
    );
    assert!(queue.take(take(t0 + Duration::from_millis(5), 8)).is_none());
    let formed = queue
        .take(take(later + Duration::from_millis(5), 8))
        .expect("due by its own age");
    assert_eq!(formed.inputs, ["b0"]);
}

#[test]
fn removing_a_request_frees_its_inputs_and_keeps_the_rest_in_order() {
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(9);
    let mut queue = Queue::default();
    push_plain(&mut queue, 1, texts("a", 2), t0, far);
    push_plain(&mut queue, 2, texts("b", 2), t0, far);
    assert_eq!(queue.remove(1).inputs, 2);
    assert_eq!(queue.remove(1).inputs, 0, "already gone");
    assert_eq!(queue.inputs(), 2);
    let formed = queue.take(take(t0, 2)).expect("full");
    assert_eq!(formed.inputs, ["b0", "b1"]);
}

/// The CPU cost of forming batches, by tenants waiting (docs/design/fair-share.md). Ignored (a
/// measurement, not a check):
/// `cargo test --release -p embatch-worker --lib take_cost -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement for docs/design/fair-share.md, not a check"]
fn take_cost() {
    for tenants in [1usize, 2, 8, 64] {
        let mut total = Duration::ZERO;
        let mut batches = 0u32;
        for _ in 0..20 {
            let t0 = Instant::now();
            let mut queue = Queue::default();
            for id in 0..4096u64 {
                let name = format!("t{}", id as usize % tenants);
                queue.push(
                    id,
                    Arrival {
                        inputs: vec![Input::from("x")],
                        lengths: vec![1],
                        options: EmbedOptions::default(),
                        share: Share {
                            tenant: name.as_str().into(),
                            weight: 1 + (id % 2) as u32,
                            scope: name.as_str().into(),
                        },
                        accepted: t0,
                        deadline: t0 + Duration::from_secs(60),
                    },
                );
            }
            let started = std::time::Instant::now();
            while queue.take(take(t0, 32)).is_some() {
                batches += 1;
            }
            total += started.elapsed();
        }
        println!(
            "{tenants} tenant(s): {:.1} µs per 32-input batch formed from 4096 queued",
            total.as_secs_f64() * 1e6 / f64::from(batches)
        );
    }
}
