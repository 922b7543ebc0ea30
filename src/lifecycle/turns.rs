//! Turns to write: a fixed number of migrations write at once, and the next turn goes to the
//! waiting migration of the first rank, the one that came first among equals.

use std::collections::BTreeSet;
use std::pin::pin;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Where a migration waits: its rank (lower goes first), then when it came.
pub type Place = (u8, u64);

/// A fixed number of turns to write, given out by [`Place`].
#[derive(Debug)]
pub struct Turns {
    queue: Mutex<Queue>,
    /// Fires when a turn is given back or the queue's head changes.
    changed: Notify,
}

#[derive(Debug)]
struct Queue {
    free: usize,
    waiting: BTreeSet<Place>,
    arrivals: u64,
}

/// A turn to write, given back when dropped.
#[derive(Debug)]
pub struct Turn {
    turns: Arc<Turns>,
}

impl Turns {
    /// `count` turns, at least one.
    pub fn new(count: usize) -> Arc<Self> {
        let queue = Queue { free: count.max(1), waiting: BTreeSet::new(), arrivals: 0 };
        Arc::new(Turns { queue: Mutex::new(queue), changed: Notify::new() })
    }

    /// A number that orders arrivals: the second part of a [`Place`].
    pub fn arrival(&self) -> u64 {
        let mut queue = self.queue();
        queue.arrivals += 1;
        queue.arrivals
    }

    /// Waits for a turn at `place`. Dropped before it returns, it leaves the queue.
    pub async fn take(self: &Arc<Self>, place: Place) -> Turn {
        self.queue().waiting.insert(place);
        let mut waiting = Waiting { turns: self, place, served: false };
        loop {
            let mut changed = pin!(self.changed.notified());
            changed.as_mut().enable();
            if let Some(turn) = waiting.try_take() {
                return turn;
            }
            changed.await;
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A place in the queue, left when dropped unless served.
struct Waiting<'a> {
    turns: &'a Arc<Turns>,
    place: Place,
    served: bool,
}

impl Waiting<'_> {
    fn try_take(&mut self) -> Option<Turn> {
        let mut queue = self.turns.queue();
        if queue.free == 0 || queue.waiting.first() != Some(&self.place) {
            return None;
        }
        queue.free -= 1;
        queue.waiting.remove(&self.place);
        self.served = true;
        drop(queue);
        // The next in line may find a turn free too.
        self.turns.changed.notify_waiters();
        Some(Turn { turns: self.turns.clone() })
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.served {
            self.turns.queue().waiting.remove(&self.place);
            self.turns.changed.notify_waiters();
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.turns.queue().free += 1;
        self.turns.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn settled() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[tokio::test]
    async fn the_first_rank_goes_first_then_whoever_came_first() {
        let turns = Turns::new(1);
        let held = turns.take((1, turns.arrival())).await;
        let (order, mut received) = tokio::sync::mpsc::unbounded_channel();
        let mut waiters = Vec::new();
        for (name, rank) in [("backlog-a", 1), ("backlog-b", 1), ("switch", 0)] {
            let place = (rank, turns.arrival());
            let (turns, order) = (turns.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let turn = turns.take(place).await;
                order.send(name).expect("open");
                settled().await;
                drop(turn);
            }));
            settled().await;
        }
        drop(held);
        for waiter in waiters {
            waiter.await.expect("no panic");
        }
        drop(order);
        let mut seen = Vec::new();
        while let Some(name) = received.recv().await {
            seen.push(name);
        }
        assert_eq!(seen, ["switch", "backlog-a", "backlog-b"]);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_the_queue_to_the_next() {
        let turns = Turns::new(1);
        let held = turns.take((0, turns.arrival())).await;
        let first = (0, turns.arrival());
        let gave_up = tokio::time::timeout(Duration::from_millis(20), turns.take(first)).await;
        assert!(gave_up.is_err(), "no turn is free");
        drop(held);
        let next = tokio::time::timeout(Duration::from_secs(5), turns.take((1, turns.arrival())));
        next.await.expect("the queue is not held by one who left");
    }

    #[tokio::test]
    async fn as_many_write_at_once_as_there_are_turns() {
        let turns = Turns::new(2);
        let a = turns.take((1, turns.arrival())).await;
        let _b = turns.take((1, turns.arrival())).await;
        let third = tokio::time::timeout(Duration::from_millis(20), turns.take((0, 9)));
        assert!(third.await.is_err(), "two turns, both held");
        drop(a);
        let third = tokio::time::timeout(Duration::from_secs(5), turns.take((0, 10)));
        third.await.expect("a turn given back is taken");
    }
}
