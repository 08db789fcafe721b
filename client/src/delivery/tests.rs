//! One test per transition of the delivery state machine (`State::on`), on plain instants:
//! each asserts the decision (which resend, after which pause, which timer, what is learnt).

use super::event::Resend;

#[test]
fn every_resend_reason_has_its_own_label() {
    let all = [
        Resend::NoResponders,
        Resend::Unavailable,
        Resend::NoAck,
        Resend::Reconnect,
        Resend::WorkerLost,
        Resend::WorkerReconnected,
    ];
    let mut labels: Vec<&str> = all.iter().map(|r| r.label()).collect();
    labels.sort_unstable();
    labels.dedup();
    assert_eq!(labels.len(), all.len());
}
