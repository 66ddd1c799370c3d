//! A stream whose consumer may let some items wait: the [`crate::GenerateStream`] a
//! generation returns, and the channel ([`crate::EventSender`]) a backend feeds it
//! through.
//!
//! A consumer that coalesces tokens (the worker's `pump`, which sends a chunk per
//! `worker.coalesce_ms`) does not need to be woken for every token: it comes back by
//! itself when the chunk is due. Each wake-up is a thread switch that, on a small
//! host, takes a core from the compute threads (issue 17 measured 4.7 wake-ups per
//! token through NATS against 1.3 in-process on 2 cores). [`HoldStream::hold`] says
//! so: while it is on, an item that [`MayWait`] (a token) sent through
//! [`HoldStream::channel`] is queued without waking the consumer, and any other item
//! (the end of the stream, an error) or the senders going away still wake it at
//! once, so the last chunk never waits for a timer. Streams built with
//! [`HoldStream::new`] ignore the hint.

use futures_core::Stream;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// Items a consumer can leave queued while it holds: [`HoldSender::send`] does not
/// wake a holding consumer for them.
pub trait MayWait {
    /// Whether this item may wait for the consumer to come back by itself.
    fn may_wait(&self) -> bool;
}

/// A stream of `T`, from [`Self::channel`] (which honours [`Self::hold`]) or any
/// other stream ([`Self::new`]).
pub struct HoldStream<T> {
    inner: Inner<T>,
}

enum Inner<T> {
    Boxed(Pin<Box<dyn Stream<Item = T> + Send>>),
    Channel(Arc<Shared<T>>),
}

impl<T: MayWait> HoldStream<T> {
    /// Wraps any stream (the hint of [`Self::hold`] is ignored).
    pub fn new(stream: impl Stream<Item = T> + Send + 'static) -> Self {
        Self {
            inner: Inner::Boxed(Box::pin(stream)),
        }
    }

    /// An unbounded channel: the producer sends on the [`HoldSender`] (from any
    /// thread, without blocking) and the consumer reads this stream. The stream ends
    /// when every sender is gone.
    pub fn channel() -> (HoldSender<T>, Self) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                waker: None,
                senders: 1,
                receiving: true,
                holding: false,
            }),
        });
        let sender = HoldSender(Arc::clone(&shared));
        (
            sender,
            Self {
                inner: Inner::Channel(shared),
            },
        )
    }

    /// While `on`, an item that [`MayWait`] sent through [`Self::channel`] does not
    /// wake the task polling this stream: it waits in the queue until that task
    /// polls again, which it must do by itself (on a timer). Other items and the
    /// last sender going away wake it whatever this says. A stream made with
    /// [`Self::new`] wakes its consumer as its source decides.
    pub fn hold(&mut self, on: bool) {
        if let Inner::Channel(shared) = &self.inner {
            shared.lock().holding = on;
        }
    }
}

impl<T> std::fmt::Debug for HoldStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Boxed(_) => f.write_str("HoldStream(boxed)"),
            Inner::Channel(shared) => {
                let state = shared.lock();
                f.debug_struct("HoldStream")
                    .field("queued", &state.queue.len())
                    .field("senders", &state.senders)
                    .field("holding", &state.holding)
                    .finish()
            }
        }
    }
}

impl<T> Stream for HoldStream<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        match &mut self.get_mut().inner {
            Inner::Boxed(stream) => stream.as_mut().poll_next(cx),
            Inner::Channel(shared) => {
                let mut state = shared.lock();
                if let Some(item) = state.queue.pop_front() {
                    return Poll::Ready(Some(item));
                }
                if state.senders == 0 {
                    return Poll::Ready(None);
                }
                match &mut state.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    slot => *slot = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

impl<T> Drop for HoldStream<T> {
    fn drop(&mut self) {
        if let Inner::Channel(shared) = &self.inner {
            let mut state = shared.lock();
            state.receiving = false;
            // Nobody will read them; free them now, not when the last sender goes.
            state.queue.clear();
        }
    }
}

/// The sending half of [`HoldStream::channel`]. Clones share the stream; it ends
/// when the last one is dropped.
pub struct HoldSender<T>(Arc<Shared<T>>);

impl<T: MayWait> HoldSender<T> {
    /// Queues `item`; gives it back when the stream was dropped (nobody reads it).
    /// Wakes the consumer unless `item` may wait and the consumer holds.
    pub fn send(&self, item: T) -> Result<(), T> {
        let mut state = self.0.lock();
        if !state.receiving {
            return Err(item);
        }
        let quiet = state.holding && item.may_wait();
        state.queue.push_back(item);
        let waker = if quiet { None } else { state.waker.take() };
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Whether the stream was dropped (the consumer is gone).
    pub fn is_closed(&self) -> bool {
        !self.0.lock().receiving
    }
}

impl<T> Clone for HoldSender<T> {
    fn clone(&self) -> Self {
        self.0.lock().senders += 1;
        Self(Arc::clone(&self.0))
    }
}

impl<T> Drop for HoldSender<T> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.senders -= 1;
        let waker = if state.senders == 0 { state.waker.take() } else { None };
        drop(state);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> std::fmt::Debug for HoldSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HoldSender")
    }
}

struct Shared<T> {
    state: Mutex<State<T>>,
}

impl<T> Shared<T> {
    /// The state; a panic while it was held left it consistent (every update is
    /// one assignment or one queue operation), so a poisoned lock is taken as is.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct State<T> {
    queue: VecDeque<T>,
    /// The consumer's waker, from its last `Pending` poll.
    waker: Option<Waker>,
    senders: usize,
    /// False once the stream is dropped.
    receiving: bool,
    /// Set by [`HoldStream::hold`].
    holding: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A generation's items in miniature: tokens may wait, the end may not.
    #[derive(Debug, PartialEq)]
    enum Item {
        Token(u32),
        End,
    }

    impl MayWait for Item {
        fn may_wait(&self) -> bool {
            matches!(self, Item::Token(_))
        }
    }

    /// Counts its wake-ups.
    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Counter>, Waker) {
        let c = Arc::new(Counter::default());
        let w = Waker::from(Arc::clone(&c));
        (c, w)
    }

    fn woken(c: &Counter) -> usize {
        c.0.load(Ordering::SeqCst)
    }

    /// Polls once with `waker`.
    fn poll(stream: &mut HoldStream<Item>, waker: &Waker) -> Poll<Option<Item>> {
        Pin::new(stream).poll_next(&mut Context::from_waker(waker))
    }

    #[test]
    fn items_come_out_in_order_and_the_stream_ends_with_the_last_sender() {
        let (tx, mut rx) = HoldStream::channel();
        let (c, waker) = counter();
        let tx2 = tx.clone();
        tx.send(Item::Token(1)).unwrap();
        tx2.send(Item::Token(2)).unwrap();
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(Some(Item::Token(1))));
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(Some(Item::Token(2))));
        assert!(poll(&mut rx, &waker).is_pending());
        drop(tx);
        assert!(poll(&mut rx, &waker).is_pending(), "one sender is left");
        drop(tx2);
        assert_eq!(woken(&c), 1, "the last sender going wakes the consumer");
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(None));
    }

    #[test]
    fn every_item_wakes_a_consumer_that_does_not_hold() {
        let (tx, mut rx) = HoldStream::channel();
        let (c, waker) = counter();
        for i in 0..3 {
            assert!(poll(&mut rx, &waker).is_pending());
            tx.send(Item::Token(i)).unwrap();
            assert_eq!(woken(&c), i as usize + 1);
            assert_eq!(poll(&mut rx, &waker), Poll::Ready(Some(Item::Token(i))));
        }
    }

    #[test]
    fn a_holding_consumer_is_woken_by_what_may_not_wait_and_by_the_senders_going() {
        let (c, waker) = counter();

        let (tx, mut rx) = HoldStream::channel();
        rx.hold(true);
        assert!(poll(&mut rx, &waker).is_pending());
        tx.send(Item::Token(1)).unwrap();
        tx.send(Item::Token(2)).unwrap();
        assert_eq!(woken(&c), 0, "tokens wait quietly");
        tx.send(Item::End).unwrap();
        assert_eq!(woken(&c), 1, "the end wakes");
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(Some(Item::Token(1))));
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(Some(Item::Token(2))));
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(Some(Item::End)));

        let (tx, mut rx) = HoldStream::channel();
        rx.hold(true);
        assert!(poll(&mut rx, &waker).is_pending());
        tx.send(Item::Token(1)).unwrap();
        drop(tx);
        assert_eq!(woken(&c), 2, "the senders going wakes");
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(Some(Item::Token(1))));
        assert_eq!(poll(&mut rx, &waker), Poll::Ready(None));

        // Holding off again: tokens wake as before.
        let (tx, mut rx) = HoldStream::channel();
        rx.hold(true);
        assert!(poll(&mut rx, &waker).is_pending());
        rx.hold(false);
        tx.send(Item::Token(1)).unwrap();
        assert_eq!(woken(&c), 3);
    }

    #[test]
    fn a_dropped_stream_refuses_items() {
        let (tx, rx) = HoldStream::channel();
        tx.send(Item::Token(1)).unwrap();
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(tx.send(Item::Token(2)), Err(Item::Token(2)));
    }

    #[test]
    fn a_wrapped_stream_ignores_the_hint() {
        let (_, waker) = counter();
        let mut s = HoldStream::new(IterStream(vec![Item::Token(7)].into_iter()));
        s.hold(true);
        assert_eq!(poll(&mut s, &waker), Poll::Ready(Some(Item::Token(7))));
        assert_eq!(poll(&mut s, &waker), Poll::Ready(None));
    }

    /// A ready stream over an iterator (the crate has no `futures` dependency).
    struct IterStream<I>(I);

    impl<I: Iterator<Item = Item> + Unpin> Stream for IterStream<I> {
        type Item = Item;
        fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Item>> {
            Poll::Ready(self.get_mut().0.next())
        }
    }
}
