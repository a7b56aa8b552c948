//! The one clock of a schedule: wall time plus an offset that the plan moves
//! forward, read by every engine of the schedule (and the settling one).
//!
//! Engines read time from a [`ManualClock`] they share. A small task keeps
//! its hand at the wall clock plus the offset, so time passes as it does in
//! production (sagas grow stale, sold-out marks age, short holds fall due on
//! their own), and [`ScheduleClock::advance`] moves the offset on, so
//! deadlines and a sale window's end are passed at a point of the schedule
//! instead of after a sleep. Both move the hand under one lock and only
//! forward: a deadline once passed stays passed for every engine.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardstock::engine::{Clock, ManualClock};

/// How often the keeper moves the hand to wall time (the clock lags wall
/// time plus offset by at most this, plus scheduling).
const TICK: Duration = Duration::from_millis(1);

/// Wall time plus an offset, never moving backwards (see the module docs).
pub struct ScheduleClock {
    hand: ManualClock,
    /// Ms added to wall time; the lock also orders every move of the hand.
    offset: Mutex<i64>,
}

impl ScheduleClock {
    /// A clock at wall time now, followed by a task until the returned guard
    /// is dropped.
    pub fn start() -> (Arc<Self>, Keeper) {
        let clock = Arc::new(Self {
            hand: ManualClock::starting_now(),
            offset: Mutex::new(0),
        });
        let follower = clock.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                follower.follow();
            }
        });
        (clock, Keeper(task.abort_handle()))
    }

    /// What an engine reads (the hand, shared).
    pub fn clock(&self) -> Clock {
        self.hand.clone().into()
    }

    /// Now, in Unix ms, as the engines read it.
    pub fn now_ms(&self) -> i64 {
        self.hand.now_ms()
    }

    /// Moves every engine's time forward by `by`, at once.
    pub fn advance(&self, by: Duration) {
        let mut offset = self.offset.lock().unwrap();
        *offset += by.as_millis() as i64;
        self.set_at_least(*offset);
    }

    fn follow(&self) {
        let offset = self.offset.lock().unwrap();
        self.set_at_least(*offset);
    }

    /// Puts the hand at wall time plus `offset` unless it is ahead already
    /// (called under the offset's lock).
    fn set_at_least(&self, offset: i64) {
        let at = wall_ms() + offset;
        if at > self.hand.now_ms() {
            self.hand.set(at);
        }
    }
}

/// Unix ms, from the system clock.
fn wall_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as i64
}

/// Stops the clock's keeper when dropped (the schedule is over).
pub struct Keeper(tokio::task::AbortHandle);

impl Drop for Keeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[tokio::test]
async fn the_schedule_clock_follows_wall_time_and_jumps_forward_only() {
    let (clock, _keeper) = ScheduleClock::start();
    let start = clock.now_ms();
    // It follows wall time: the hand passes start + 20 ms on its own. (Read
    // until it does, within a bound: a busy machine may not run the keeper
    // between one sleep's end and the next read.)
    let bound = std::time::Instant::now() + Duration::from_secs(10);
    let mut later = clock.now_ms();
    while later - start < 20 {
        assert!(
            std::time::Instant::now() < bound,
            "it follows wall time: {start} -> {later} after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        later = clock.now_ms();
    }
    clock.advance(Duration::from_secs(60));
    let jumped = clock.now_ms();
    assert!(jumped - later >= 60_000, "{later} -> {jumped}");
    let engine_sees = clock.clock();
    let mut last = engine_sees.now_ms();
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let now = engine_sees.now_ms();
        assert!(now >= last, "never backwards: {last} -> {now}");
        last = now;
    }
}
