//! Events of an array (member faulty, rebuild started, …), fanned out to subscribers.
//!
//! Subscribers are channels; a subscriber that went away is dropped at the next event. Events are
//! also logged, so a daemon without subscribers still leaves a trace.

use crate::clock::Clock;
use parking_lot::Mutex;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// e.g. `member_faulty`, `spare_active`, `rebuild_started`, `check_finished`.
    pub kind: &'static str,
    pub array: String,
    pub member: Option<String>,
    pub message: String,
    pub unix_ms: u64,
}

pub(crate) struct EventBus {
    subscribers: Mutex<Vec<Sender<Event>>>,
    /// Stamps `unix_ms`.
    clock: Arc<dyn Clock>,
}

impl EventBus {
    pub fn new(clock: Arc<dyn Clock>) -> EventBus {
        EventBus {
            subscribers: Mutex::default(),
            clock,
        }
    }

    pub fn subscribe(&self) -> Receiver<Event> {
        let (tx, rx) = channel();
        self.subscribers.lock().push(tx);
        rx
    }

    pub fn emit(&self, kind: &'static str, array: &str, member: Option<&str>, message: String) {
        let unix_ms = crate::clock::unix_ms(self.clock.as_ref());
        tracing::info!(
            event = kind,
            array,
            member = member.unwrap_or(""),
            "{message}"
        );
        let ev = Event {
            kind,
            array: array.to_string(),
            member: member.map(str::to_string),
            message,
            unix_ms,
        };
        self.subscribers
            .lock()
            .retain(|s| s.send(ev.clone()).is_ok());
    }
}
