//! `null:`: accepts everything and keeps nothing. For measuring the rest of the engine, and
//! (`null:?delay=5ms`) for standing in for a slow backend.

use std::time::Duration;

use super::{Backend, BackendError, BackendFactory, ItemError};
use crate::document::Document;

pub struct NullFactory {
    pub delay: Duration,
}

impl BackendFactory for NullFactory {
    fn describe(&self) -> String {
        if self.delay.is_zero() {
            "null:".into()
        } else {
            format!("null:?delay={}us", self.delay.as_micros())
        }
    }

    fn connect(&self) -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(NullBackend { delay: self.delay }))
    }
}

struct NullBackend {
    delay: Duration,
}

impl Backend for NullBackend {
    fn write(&mut self, batch: &[Document]) -> Vec<Result<(), ItemError>> {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        vec![Ok(()); batch.len()]
    }

    fn flush(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
}
