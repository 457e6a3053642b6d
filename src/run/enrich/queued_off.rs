//! `enrich --queue` in a build without the `nats` feature: no broker run can be made, so
//! none reaches the workers ([`QueuedRun`] has no values).

use crossbeam_channel::Receiver;

use super::{EnrichWorker, Shared};
use crate::lifecycle::{EnrichStore, StoreError, WorkItem};

/// A broker run; this build has none.
pub enum QueuedRun {}

impl QueuedRun {
    pub fn redeliveries(&self) -> u64 {
        match *self {}
    }

    pub(super) fn note(&self) -> String {
        match *self {}
    }

    pub(super) fn dead_letters(
        &self,
    ) -> Result<Receiver<(WorkItem, u32)>, std::convert::Infallible> {
        match *self {}
    }
}

pub(super) fn feed<S: EnrichStore>(
    _store: S,
    _shared: &Shared<'_>,
    run: &QueuedRun,
    _dead: Receiver<(WorkItem, u32)>,
) -> Result<(), StoreError> {
    match *run {}
}

pub(super) fn work<S: EnrichStore>(
    _w: EnrichWorker<S>,
    _shared: &Shared<'_>,
    run: &QueuedRun,
) -> Result<(), StoreError> {
    match *run {}
}
