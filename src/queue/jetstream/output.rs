//! The ordered output task: publishes pipelined under a window, coalesced per subject, and a
//! message's acknowledgement sent only after every publish before it was stored.

use super::*;

/// The output task: publishes in order, pipelined, each retried until stored; an
/// acknowledgement goes out only after every publish queued before it is confirmed.
pub(super) async fn output(js: jetstream::Context, mut rx: tokio::sync::mpsc::Receiver<Outgoing>) {
    let mut ordered: FuturesOrdered<Ordered> = FuturesOrdered::new();
    let mut open = true;
    // What coalescing took from the channel that belongs to the next turn.
    let mut carry: Option<Outgoing> = None;
    // Bytes of the publishes in flight: with coalesced messages the window's count alone
    // would not bound memory.
    let mut in_flight = 0usize;
    loop {
        tokio::select! {
            next = next_outgoing(&mut rx, &mut carry), if open && ordered.len() < PUBLISH_WINDOW && in_flight < IN_FLIGHT_BYTES => match next {
                Some(Outgoing::Publish { subject, payload }) => {
                    // The publishes to this subject already waiting go in the same message.
                                        let mut bytes = 6 + 4 + payload.len();
                    let mut items = vec![payload];
                    while items.len() < COALESCE_ITEMS {
                        match rx.try_recv() {
                            Ok(Outgoing::Publish { subject: s, payload: p })
                                if s == subject && bytes + 4 + p.len() <= COALESCE_BYTES =>
                            {
                                bytes += 4 + p.len();
                                items.push(p);
                            }
                            Ok(other) => {
                                carry = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    let payload = if items.len() == 1 {
                        items.pop().expect("one item")
                    } else {
                        encode_batch(&items, 0)
                    };
                    in_flight += payload.len();
                    ordered.push_back(publish(js.clone(), subject, payload));
                }
                Some(Outgoing::PublishAlone { subject, payload }) => {
                    in_flight += payload.len();
                    ordered.push_back(publish(js.clone(), subject, payload));
                }
                Some(Outgoing::Ack(msg, kind)) => {
                    ordered.push_back(Box::pin(async move { (Some((*msg, kind)), 0) }));
                }
                Some(Outgoing::Flush(done)) => {
                    ordered.push_back(Box::pin(async move {
                        let _ = done.send(());
                        (None, 0)
                    }));
                }
                None => open = false,
            },
            Some((reply, bytes)) = ordered.next(), if !ordered.is_empty() => {
                in_flight -= bytes;
                if let Some((msg, kind)) = reply {
                    let _ = msg.ack_with(kind).await;
                }
            }
            else => break,
        }
    }
}

/// The next outgoing message: the one coalescing carried over, else the channel's next.
pub(super) async fn next_outgoing(
    rx: &mut tokio::sync::mpsc::Receiver<Outgoing>,
    carry: &mut Option<Outgoing>,
) -> Option<Outgoing> {
    match carry.take() {
        Some(o) => Some(o),
        None => rx.recv().await,
    }
}

/// Publish until the stream has stored the message.
pub(super) fn publish(js: jetstream::Context, subject: String, payload: Bytes) -> Ordered {
    Box::pin(async move {
        let bytes = payload.len();
        let mut pause = Duration::from_millis(5);
        loop {
            if let Ok(ack) = js.publish(subject.clone(), payload.clone()).await {
                if ack.await.is_ok() {
                    return (None, bytes);
                }
            }
            // Full stream (backpressure), no leader, or no server: wait and send it again. A
            // duplicate (stored, but the ack was lost) is harmless: every stage is idempotent.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    })
}
