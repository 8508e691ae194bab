//! Unit tests of postgres.

use super::*;

fn job(source: u64) -> (InsertJob, tokio::sync::oneshot::Receiver<Result<()>>) {
    let msg = NewMessage {
        msgid: [0; 16],
        queue: 1,
        corrid: None,
        priority: 1,
        enq_time: 0,
        delay_until: None,
        expire_at: None,
        sender: None,
        enq_user_id: None,
        exception_queue: None,
        payload: Vec::new(),
        enq_txn: None,
        consumers: vec![String::new()],
        prio_key: 0,
        spilled: false,
        group: None,
        enq_txn_id: None,
        origin: None,
    };
    let (done, answer) = tokio::sync::oneshot::channel();
    (InsertJob { msgs: vec![msg], sent: Sent::now(source), done }, answer)
}

/// Sources 1..=4 came back 200 µs after their answers before, and were answered now.
fn four_regulars() -> Regulars {
    let mut r = Regulars::default();
    let t = std::time::Instant::now();
    for s in 1..=4 {
        r.answered(s, t - Duration::from_micros(400));
        r.arrived(s, t - Duration::from_micros(200));
        r.answered(s, t);
    }
    r
}

// On the test's single-threaded runtime the spawned producers run only when the writer
// waits: without waiting for regulars the batch would be the first request alone. Tokio's
// clock is paused, so the wait's timer fires only once nothing else can run: the machine's
// load cannot make the producers late.
#[tokio::test(start_paused = true)]
async fn the_writer_waits_for_the_regulars_it_has_just_answered() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut regulars = four_regulars();
    let (first, _a) = job(1);
    let others: Vec<_> = (2..=4).map(job).collect();
    let (jobs, _answers): (Vec<_>, Vec<_>) = others.into_iter().unzip();
    let sender = tx.clone();
    tokio::spawn(async move {
        for j in jobs {
            let _ = sender.send(j);
        }
    });
    let batch = Coalescer::collect(
        &mut rx,
        first,
        &mut regulars,
        COALESCE_MAX_ROWS,
        &GroupCounters::register(&Metrics::default()),
    )
    .await;
    let mut sources: Vec<u64> = batch.iter().map(Job::source).collect();
    sources.sort_unstable();
    assert_eq!(sources, vec![1, 2, 3, 4]);
}

#[tokio::test]
async fn a_stranger_is_written_at_once() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut regulars = four_regulars();
    // Everyone expected is in the batch already, and 9 has never been seen.
    let (first, _a) = job(9);
    let mut answers = Vec::new();
    for s in 1..=4 {
        let (j, a) = job(s);
        tx.send(j).expect("open");
        answers.push(a);
    }
    let (late, _b) = job(5);
    tokio::spawn(async move {
        let _ = tx.send(late);
    });
    let batch = Coalescer::collect(
        &mut rx,
        first,
        &mut regulars,
        COALESCE_MAX_ROWS,
        &GroupCounters::register(&Metrics::default()),
    )
    .await;
    let sources: Vec<u64> = batch.iter().map(Job::source).collect();
    assert_eq!(sources, vec![9, 1, 2, 3, 4]);
}

#[tokio::test]
async fn a_regular_that_does_not_come_back_delays_the_batch_at_most_max_wait() {
    let (_tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut regulars = four_regulars();
    let (first, _a) = job(1);
    let started = std::time::Instant::now();
    let batch = Coalescer::collect(
        &mut rx,
        first,
        &mut regulars,
        COALESCE_MAX_ROWS,
        &GroupCounters::register(&Metrics::default()),
    )
    .await;
    assert_eq!(batch.len(), 1);
    // The timer wheel has millisecond ticks, so the wait ends at the tick after the cap;
    // the margin is for a loaded test machine, not for the writer.
    assert!(started.elapsed() < super::regulars::MAX_WAIT + Duration::from_millis(500));
}

#[test]
fn own_enqueue_signals_are_skipped() {
    assert_eq!(signalled_queue("7 abc", "abc"), None);
    assert_eq!(signalled_queue("7 def", "abc"), Some(7));
    assert_eq!(signalled_queue("7", "abc"), Some(7));
    assert_eq!(signalled_queue("x def", "abc"), None);
    assert!(notify_payload!().contains(ORIGIN_SETTING), "the SQL names the same setting");
}
