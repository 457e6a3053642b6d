//! The envelope of a broker message: one item, or a batch of items coalesced by the output
//! task (magic byte, flags, lengths), and the message for bytes that are neither.

use super::*;

/// Items in the batch envelope: the magic byte, flags, the count (u32 LE), then each item's
/// length (u32 LE) and bytes.
pub(crate) fn encode_batch(items: &[Bytes], flags: u8) -> Bytes {
    let size = 6 + items.iter().map(|i| 4 + i.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.push(BATCH_MAGIC);
    out.push(flags);
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for item in items {
        out.extend_from_slice(&(item.len() as u32).to_le_bytes());
        out.extend_from_slice(item);
    }
    Bytes::from(out)
}

/// The items of a message and its envelope's flags (a plain message is one item, flags 0).
/// The bytes come from the broker, so they are untrusted: nothing is allocated beyond what
/// they hold (a count of 4 billion items in a 6-byte message is an error, not 137 GB).
pub fn split_message(payload: &Bytes) -> Result<(Vec<Bytes>, u8), BrokerError> {
    if payload.first() != Some(&BATCH_MAGIC) {
        return Ok((vec![payload.clone()], 0));
    }
    let bad = |why: String| BrokerError::Message(format!("a batch envelope {why}"));
    let flags = *payload
        .get(1)
        .ok_or_else(|| bad("cut short in its header".into()))?;
    let count = u32::from_le_bytes(
        payload
            .get(2..6)
            .ok_or_else(|| bad("cut short in its header".into()))?
            .try_into()
            .expect("4 bytes"),
    ) as usize;
    // Every item takes at least its 4-byte length.
    let room = (payload.len() - 6) / 4;
    if count > room {
        return Err(bad(format!(
            "says it holds {count} items but has room for at most {room}"
        )));
    }
    let mut at = 6usize;
    let mut items = Vec::with_capacity(count);
    for i in 0..count {
        let len = payload
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            .ok_or_else(|| bad(format!("cut short before item {i} of {count}")))?;
        at += 4;
        let end = at
            .checked_add(len)
            .filter(|&end| end <= payload.len())
            .ok_or_else(|| bad(format!("cut short in item {i} of {count}")))?;
        items.push(payload.slice(at..end));
        at = end;
    }
    if at != payload.len() {
        return Err(bad(format!(
            "has {} bytes after its {count} items",
            payload.len() - at
        )));
    }
    Ok((items, flags))
}

/// The event that dead-letters a message no process can read: the run's publisher counts it
/// and reports it with `reason`. `at` names the message (its subject and stream sequence).
pub(super) fn unreadable(
    run: RunId,
    lane: Lane,
    at: String,
    reason: &dyn std::fmt::Display,
    payload: &[u8],
) -> Event {
    let head: Vec<String> = payload
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect();
    Event {
        run_id: run,
        instance: 0,
        doc_id: at,
        parent_instance: None,
        parent_id: None,
        children: 0,
        kind: EventKind::Unreadable {
            lane: lane.name().to_string(),
            reason: format!(
                "unreadable message ({reason}; {} bytes, starting {}): dead-lettered; if no \
                 process of this run published it, find who can publish to the broker",
                payload.len(),
                head.join(" ")
            ),
        },
        redelivered: false,
        tokens: 0,
    }
}
