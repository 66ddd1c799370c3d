//! Coalescing a stream's tokens into fewer chunks.
//!
//! Every chunk is a NATS message: a wake-up of the worker's publisher, of nats-server
//! and of the client. On a small host those threads take their time slices from the
//! compute threads, so a chunk per token costs decode throughput (issue 17 measured
//! 190–820 µs per token on 2 cores). [`Coalescer`] decides when the tokens it holds
//! go out:
//!
//! - the first token of a stream goes at once (time to first token is untouched);
//! - a token that comes `window` or more after the previous one goes at once: a slow
//!   stream gets one chunk per token, as before;
//! - while tokens come faster than one per `window`, they are held and go together
//!   when the first held one has waited `window`, or earlier when the next token is
//!   not expected before then (the last gap predicts the next), or when [`MAX_TOKENS`]
//!   are held, or with the stream's last chunk;
//! - tokens that are already waiting in the backend's channel always join the chunk
//!   being built (the caller drains them before asking [`Coalescer::ready`]).
//!
//! So no token waits longer than `window`, and a zero `window` turns holding off.
//! The struct only decides; `service::pump` moves the tokens. While it holds tokens,
//! `pump` is not woken for each new one: it tells the backend's stream to queue
//! tokens quietly (`GenerateStream::hold`; the stream's end and errors still
//! wake it) and comes back on its timer when the chunk is due, taking every token
//! that arrived meanwhile. A wake-up per token was most of what the fabric still cost
//! (issue 17: 4.7 wake-ups of the non-compute threads per token through NATS, 2.1
//! after this and one async thread). Streams that cannot hold wake `pump` per token,
//! and then the "next token not expected before then" rule above can send early.

use std::time::{Duration, Instant};
use switchyard_messages::Token;

/// The most tokens one chunk carries.
pub const MAX_TOKENS: usize = 64;

/// Tokens waiting to be sent, and when they must go.
#[derive(Debug)]
pub struct Coalescer {
    window: Duration,
    held: Vec<Token>,
    /// When the held tokens must go (the first held one's arrival + `window`).
    due: Option<Instant>,
    /// The previous token's arrival; `None` before the first token.
    last: Option<Instant>,
    /// The gap before the previous token, used to predict the next arrival.
    gap: Duration,
}

impl Coalescer {
    /// Holds tokens for at most `window` (zero: never).
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            held: Vec::new(),
            due: None,
            last: None,
            gap: Duration::ZERO,
        }
    }

    /// A token arrived at `now`.
    pub fn push(&mut self, token: Token, now: Instant) {
        let gap = self.last.map(|last| now.saturating_duration_since(last));
        self.last = Some(now);
        // The first token, and any token after a quiet spell, go at once.
        let fast = gap.is_some_and(|g| g < self.window);
        self.gap = gap.unwrap_or(self.window);
        if self.held.is_empty() {
            self.due = Some(if fast { now + self.window } else { now });
        }
        if !fast {
            self.due = Some(now);
        }
        self.held.push(token);
    }

    /// Whether the held tokens should go now, given that nothing more is waiting
    /// in the backend's channel.
    pub fn ready(&self, now: Instant) -> bool {
        let Some(due) = self.due else {
            return false;
        };
        self.held.len() >= MAX_TOKENS || now >= due || now + self.gap >= due
    }

    /// Whether another token may join before sending (the chunk is not full).
    pub fn has_room(&self) -> bool {
        self.held.len() < MAX_TOKENS
    }

    /// When the held tokens must go; `None` when nothing is held.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// The held tokens, in order, to send now.
    pub fn take(&mut self) -> Vec<Token> {
        self.due = None;
        std::mem::take(&mut self.held)
    }

    /// Whether tokens are held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(id: u32) -> Token {
        Token {
            id,
            text: format!("t{id}"),
            logprob: None,
            reasoning: false,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_first_token_goes_at_once() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(10));
        c.push(tok(0), t0);
        assert!(c.ready(t0));
        assert_eq!(c.take(), vec![tok(0)]);
        assert!(c.is_empty() && c.due().is_none() && !c.ready(t0));
    }

    #[test]
    fn slow_tokens_go_one_by_one() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(5));
        for i in 0..5u32 {
            let now = t0 + ms(20) * i;
            c.push(tok(i), now);
            assert!(c.ready(now), "token {i} arrives 20 ms after the last");
            assert_eq!(c.take(), vec![tok(i)]);
        }
    }

    #[test]
    fn fast_tokens_are_held_until_the_window_ends() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(10));
        c.push(tok(0), t0);
        assert_eq!(c.take(), vec![tok(0)]);
        // One token every 2 ms: held; the first held one fixes the deadline.
        c.push(tok(1), t0 + ms(2));
        assert!(!c.ready(t0 + ms(2)));
        assert_eq!(c.due(), Some(t0 + ms(12)));
        for (i, at) in [(2, 4), (3, 6), (4, 8)] {
            c.push(tok(i), t0 + ms(at));
            assert!(!c.ready(t0 + ms(at)), "token {i}");
        }
        assert_eq!(c.due(), Some(t0 + ms(12)), "later tokens do not push it back");
        // The next token (due at 12 ms by the last gap) would still make it…
        c.push(tok(5), t0 + ms(10));
        // …but the one after would not: send now rather than wait.
        assert!(c.ready(t0 + ms(10)));
        assert_eq!(c.take(), (1..=5).map(tok).collect::<Vec<_>>());
    }

    #[test]
    fn the_deadline_sends_what_is_held() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(10));
        c.push(tok(0), t0);
        c.take();
        c.push(tok(1), t0 + ms(1));
        assert!(!c.ready(t0 + ms(1)));
        // The backend goes quiet: the timer fires at the deadline.
        assert!(!c.ready(t0 + ms(8)));
        assert!(c.ready(t0 + ms(11)));
        assert_eq!(c.take(), vec![tok(1)]);
    }

    #[test]
    fn a_quiet_spell_sends_at_once_with_what_is_held() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(10));
        c.push(tok(0), t0);
        c.take();
        c.push(tok(1), t0 + ms(1));
        // The timer was late; the next token comes 30 ms later: both go now.
        c.push(tok(2), t0 + ms(31));
        assert!(c.ready(t0 + ms(31)));
        assert_eq!(c.take(), vec![tok(1), tok(2)]);
    }

    #[test]
    fn a_full_chunk_goes_at_once() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(ms(10));
        c.push(tok(0), t0);
        c.take();
        for i in 1..=MAX_TOKENS as u32 {
            assert!(c.has_room());
            c.push(tok(i), t0 + Duration::from_micros(u64::from(i)));
        }
        assert!(!c.has_room());
        assert!(c.ready(t0 + ms(1)));
        let sent = c.take();
        assert_eq!(sent.len(), MAX_TOKENS);
        assert_eq!(sent, (1..=MAX_TOKENS as u32).map(tok).collect::<Vec<_>>());
    }

    #[test]
    fn a_zero_window_never_holds() {
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::ZERO);
        for i in 0..4u32 {
            c.push(tok(i), t0);
            assert!(c.ready(t0));
            assert_eq!(c.take(), vec![tok(i)]);
        }
    }

    #[test]
    fn tokens_waiting_together_share_a_chunk_even_without_a_window() {
        // The caller drains what is already queued before asking `ready`.
        let t0 = Instant::now();
        let mut c = Coalescer::new(Duration::ZERO);
        for i in 0..3u32 {
            c.push(tok(i), t0);
        }
        assert!(c.ready(t0));
        assert_eq!(c.take(), vec![tok(0), tok(1), tok(2)]);
    }
}
