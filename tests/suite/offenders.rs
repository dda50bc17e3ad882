//! The top offenders in bounded memory (`floodgate::offenders`): a 1%
//! flooder among a million clients is named first within the stated bound,
//! the memory never grows, few keys are counted exactly, and concurrent
//! recorders and reporters lose and double-count nothing.

use std::collections::HashMap;
use std::time::Instant;

use floodgate::offenders::{Offenders, Report};

/// The flooder's id, beside the others' `0..clients`.
const FLOODER: u64 = u64::MAX;

/// A shuffled stream of rejections: each of `clients` other clients refused
/// one to three times, and `FLOODER` for 1% of the whole.
fn stream(clients: u64, seed: u64) -> (Vec<u64>, u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut events = Vec::with_capacity(clients as usize * 21 / 10);
    for client in 0..clients {
        for _ in 0..rng.u64(1..=3) {
            events.push(client);
        }
    }
    // f / (others + f) = 1/100.
    let flooder = (events.len() as u64).div_ceil(99);
    events.extend((0..flooder).map(|_| FLOODER));
    rng.shuffle(&mut events);
    (events, flooder)
}

/// The stated bound for one listed key: `refused − error ≤ truth ≤
/// refused + unattributed`, `error ≤ error_bound`, and the bound itself at
/// most `N_s / m_s ≤ recorded / floor(capacity / shards)`.
fn assert_within_bound<K>(report: &Report<K>, listed: usize, truth: u64, offenders: &Offenders<K>) {
    let entry = &report.offenders[listed];
    assert!(
        entry.refused - entry.error <= truth,
        "{truth} below {} - {}",
        entry.refused,
        entry.error
    );
    assert!(
        truth <= entry.refused + report.unattributed,
        "{truth} above {}",
        entry.refused
    );
    assert!(entry.error <= report.error_bound);
    let smallest_share = (offenders.capacity() / offenders.shards()) as u64;
    assert!(report.error_bound <= report.recorded / smallest_share);
}

#[test]
fn a_one_percent_flooder_among_a_million_clients_is_named_first() {
    let (events, flooder) = stream(1_000_000, 28);
    let offenders = Offenders::<u64>::new(1024);
    let footprint = offenders.footprint();

    let started = Instant::now();
    for (n, &client) in events.iter().enumerate() {
        offenders.record(&client, 1);
        if n % 250_000 == 0 {
            assert!(offenders.len() <= offenders.capacity());
        }
    }
    let took = started.elapsed();

    assert_eq!(offenders.len(), offenders.capacity());
    assert_eq!(offenders.footprint(), footprint, "the summary grew");
    let top = offenders.top(10);
    assert_eq!(top.len(), 10);
    assert_eq!(top[0].key, FLOODER);

    let report = offenders.take();
    assert_eq!(report.offenders[0], top[0]);
    assert_eq!(report.recorded + report.unattributed, events.len() as u64);
    assert_eq!(
        report.unattributed, 0,
        "one thread never finds a shard busy"
    );
    assert_within_bound(&report, 0, flooder, &offenders);
    let first = &report.offenders[0];
    println!(
        "{} rejections, {} clients, {} shards of {} entries, {footprint} bytes: flooder \
         refused {flooder} times, reported {} (error {}, units {}), error bound {}, \
         runner-up {}; {:.0} ns a record ({took:.2?} in all)",
        events.len(),
        1_000_001,
        offenders.shards(),
        offenders.capacity() / offenders.shards(),
        first.refused,
        first.error,
        first.units,
        report.error_bound,
        report.offenders[1].refused,
        took.as_nanos() as f64 / events.len() as f64,
    );
}

#[test]
fn fewer_keys_than_a_shard_holds_are_counted_exactly() {
    // At most `capacity / shards` keys never take an entry over; one shard
    // of 100 holds 100.
    let chosen = Offenders::<String>::new(1024);
    let fit = (chosen.capacity() / chosen.shards()) as u64;
    for (offenders, keys) in [(chosen, fit), (Offenders::with_shards(100, 1), 100)] {
        let mut rng = fastrand::Rng::with_seed(keys);
        let mut exact: HashMap<String, (u64, u64)> = HashMap::new();
        for _ in 0..20_000 {
            let key = format!("client-{}", rng.u64(..keys));
            let cost = rng.u64(1..=10);
            offenders.record(key.as_str(), cost);
            let counts = exact.entry(key).or_default();
            counts.0 += 1;
            counts.1 += cost;
        }
        let report = offenders.take();
        assert_eq!(report.offenders.len(), keys as usize);
        assert_eq!(report.error_bound, 0);
        for offender in &report.offenders {
            assert_eq!(offender.error, 0);
            assert_eq!(
                (offender.refused, offender.units),
                exact[&offender.key],
                "{}",
                offender.key
            );
        }
        assert!(report
            .offenders
            .windows(2)
            .all(|w| w[0].refused >= w[1].refused));
        assert_eq!(report.recorded, 20_000);
        assert_eq!(
            report.recorded_units,
            exact.values().map(|c| c.1).sum::<u64>()
        );
    }
}

#[test]
fn concurrent_recorders_lose_and_double_count_nothing() {
    let (events, flooder) = stream(200_000, 29);
    for threads in [2, 4] {
        let offenders = Offenders::<u64>::new(1024);
        std::thread::scope(|scope| {
            for chunk in events.chunks(events.len().div_ceil(threads)) {
                let offenders = &offenders;
                scope.spawn(move || {
                    for client in chunk {
                        offenders.record(client, 2);
                    }
                });
            }
        });
        let report = offenders.take();
        assert_eq!(report.recorded + report.unattributed, events.len() as u64);
        assert_eq!(
            report.recorded_units + report.unattributed_units,
            2 * events.len() as u64
        );
        assert_eq!(report.offenders[0].key, FLOODER);
        assert_within_bound(&report, 0, flooder, &offenders);
        println!(
            "{threads} threads: {} unattributed of {}; flooder {flooder}, reported {} (error {})",
            report.unattributed,
            events.len(),
            report.offenders[0].refused,
            report.offenders[0].error,
        );
    }
}

#[test]
fn reports_taken_while_threads_record_add_up_to_every_record() {
    let (events, _) = stream(100_000, 30);
    let offenders = Offenders::<u64>::new(256);
    let recording = std::sync::atomic::AtomicUsize::new(2);
    let reports = std::thread::scope(|scope| {
        for chunk in events.chunks(events.len().div_ceil(2)) {
            let (offenders, recording) = (&offenders, &recording);
            scope.spawn(move || {
                for client in chunk {
                    offenders.record(client, 1);
                }
                recording.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            });
        }
        let mut reports = Vec::new();
        while recording.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            reports.push(offenders.take());
            std::thread::yield_now();
        }
        reports
    });
    let last = offenders.take();
    let mut total = 0;
    for report in reports.iter().chain([&last]) {
        assert!(report.offenders.len() <= offenders.capacity());
        let counted: u64 = report.offenders.iter().map(|o| o.refused).sum();
        assert_eq!(
            counted, report.recorded,
            "an interval's counts add up to its records"
        );
        total += report.recorded + report.unattributed;
    }
    assert_eq!(total, events.len() as u64);
    println!("{} intervals", reports.len() + 1);
}

#[test]
fn take_starts_a_new_interval() {
    let offenders = Offenders::<String>::new(64);
    for _ in 0..5 {
        offenders.record("before", 3);
    }
    offenders.record("both", 1);
    let first = offenders.take();
    assert_eq!(first.recorded, 6);
    assert_eq!(first.recorded_units, 16);
    assert_eq!(first.offenders[0].key, "before");
    assert_eq!(
        (first.offenders[0].refused, first.offenders[0].units),
        (5, 15)
    );

    assert!(offenders.is_empty());
    assert!(offenders.top(10).is_empty());
    offenders.record("both", 1);
    offenders.record("after", 1);
    offenders.record("after", 1);
    let second = offenders.take();
    assert_eq!(second.recorded, 3);
    let keys: Vec<_> = second
        .offenders
        .iter()
        .map(|o| (o.key.as_str(), o.refused))
        .collect();
    assert_eq!(keys, [("after", 2), ("both", 1)]);
    assert_eq!(offenders.take().recorded, 0);
}

#[test]
fn top_ranks_and_truncates() {
    let offenders = Offenders::<u32>::with_shards(64, 4);
    for key in 0..20u32 {
        for _ in 0..=key {
            offenders.record(&key, 1);
        }
    }
    let top: Vec<_> = offenders
        .top(3)
        .iter()
        .map(|o| (o.key, o.refused))
        .collect();
    assert_eq!(top, [(19, 20), (18, 19), (17, 18)]);
    assert_eq!(offenders.top(100).len(), 20);
    assert!(offenders.top(0).is_empty());
}

#[test]
fn the_summary_is_send_and_sync() {
    fn shared<T: Send + Sync>() {}
    shared::<Offenders<String>>();
    shared::<Offenders<std::net::IpAddr>>();
}
