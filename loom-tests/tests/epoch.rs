//! The inline store's epoch collector (`store::epoch`): a pin is a plain
//! store of the epoch and a fence (under loom the collector's membarrier is
//! a SeqCst fence too: the fallback path). A table is stood in for by a
//! loom `UnsafeCell` the model keeps alive: a check reads it, and the
//! retired garbage's drop (the table's free) writes it. Loom tracks those
//! accesses, so a free that is not ordered after every read made under a
//! pin fails as a causality violation, in whatever order the threads run,
//! and a free that ran before a read fails the read's assertion.
#![cfg(floodgate_loom)]

use floodgate::__loom::Collector;
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The tables of one model: `current` indexes the published one.
struct Tables {
    collector: Collector,
    current: AtomicUsize,
    /// Each table's memory: `true` once freed.
    freed: Vec<UnsafeCell<bool>>,
}

// SAFETY: the cells are read and written only through loom's tracked
// `with`/`with_mut`, and loom fails the model on any access pair that is
// not ordered: sharing them is what the models are about.
unsafe impl Sync for Tables {}

/// The garbage of a retired table: its drop is the table's free.
struct Freed(Arc<Tables>, usize);

impl Drop for Freed {
    fn drop(&mut self) {
        // SAFETY: loom checks this write against every read (it is the
        // assertion of the models); the cell is alive as long as `self.0`.
        self.0.freed[self.1].with_mut(|freed| unsafe { *freed = true });
    }
}

fn tables(count: usize) -> Arc<Tables> {
    Arc::new(Tables {
        collector: Collector::new(),
        current: AtomicUsize::new(0),
        freed: (0..count).map(|_| UnsafeCell::new(false)).collect(),
    })
}

impl Tables {
    /// A reader's check: pin, load the current table, read it. What it
    /// read must not have been freed while the pin was held.
    fn read(&self) {
        let record = self.collector.register();
        let _pin = self.collector.pin(record);
        // Acquire, as `TableCell::load`.
        let table = self.current.load(Ordering::Acquire);
        assert!(!self.is_freed(table), "read a freed table");
    }

    /// Reads table `index`'s memory (a non-atomic read, tracked by loom).
    fn is_freed(&self, index: usize) -> bool {
        // SAFETY: loom checks this read against the free's write; the
        // cell lives as long as `self`.
        self.freed[index].with(|freed| unsafe { *freed })
    }

    /// A rebuild: publish table `to` in place of `from`, retire `from`.
    fn replace(this: &Arc<Self>, from: usize, to: usize) {
        // AcqRel, as `TableCell::publish`'s swap.
        assert_eq!(this.current.swap(to, Ordering::AcqRel), from);
        this.collector
            .retire(Box::new(Freed(Arc::clone(this), from)));
    }
}

/// A check racing a rebuild: the reader's table is never freed under its
/// pin, and once every pin is gone a collect frees the outgrown table
/// (nothing kept for ever).
#[test]
fn a_retired_table_is_not_freed_under_a_pin() {
    floodgate_loom_tests::model(|| {
        let tables = tables(2);
        let reader = {
            let tables = Arc::clone(&tables);
            thread::spawn(move || tables.read())
        };
        Tables::replace(&tables, 0, 1);
        reader.join().unwrap();
        tables.collector.collect();
        assert!(tables.is_freed(0), "kept after every pin ended");
        assert!(tables.collector.is_empty());
        assert!(!tables.is_freed(1));
    });
}

/// Two checks on one thread (the second pin re-reads the epoch) racing two
/// rebuilds: whichever tables the reader lands on are alive while it reads
/// them, and both outgrown ones are freed in the end.
#[test]
fn repinning_across_two_rebuilds() {
    floodgate_loom_tests::model(|| {
        let tables = tables(3);
        let reader = {
            let tables = Arc::clone(&tables);
            thread::spawn(move || {
                tables.read();
                tables.read();
            })
        };
        Tables::replace(&tables, 0, 1);
        Tables::replace(&tables, 1, 2);
        reader.join().unwrap();
        tables.collector.collect();
        assert!(tables.is_freed(0));
        assert!(tables.is_freed(1));
    });
}

/// The collect that frees may be another reader's unpin (the `pending`
/// retry) rather than the retire: two readers and a rebuild, and the table
/// one reader still holds is never freed by the other's unpin.
#[test]
fn an_unpin_that_collects_spares_a_held_table() {
    floodgate_loom_tests::model(|| {
        let tables = tables(2);
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let tables = Arc::clone(&tables);
                thread::spawn(move || tables.read())
            })
            .collect();
        Tables::replace(&tables, 0, 1);
        for reader in readers {
            reader.join().unwrap();
        }
        tables.collector.collect();
        assert!(tables.is_freed(0));
    });
}

/// A check of one store (scope 2) whose key's `Hash` checks another store
/// (scope 1), racing a rebuild of that other store: the nested pin widens
/// the outer one's scope before it loads the table, so a collect that
/// frees store 1's garbage never frees the table the nested check reads,
/// whatever the order; and once the pins are gone it is freed.
#[test]
fn a_pin_nested_in_another_stores_pin_holds_its_table() {
    floodgate_loom_tests::model(|| {
        let tables = tables(2);
        let reader = {
            let tables = Arc::clone(&tables);
            thread::spawn(move || {
                let record = tables.collector.register();
                let _outer = tables.collector.pin_in(record, 2);
                let _nested = tables.collector.pin_in(record, 1);
                // Acquire, as `TableCell::load`.
                let table = tables.current.load(Ordering::Acquire);
                assert!(!tables.is_freed(table), "read a freed table");
            })
        };
        assert_eq!(tables.current.swap(1, Ordering::AcqRel), 0);
        tables
            .collector
            .retire_in(Box::new(Freed(Arc::clone(&tables), 0)), 1);
        reader.join().unwrap();
        tables.collector.collect();
        assert!(tables.is_freed(0), "kept after every pin ended");
    });
}
