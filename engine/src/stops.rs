//! Holding back generated tokens whose text might begin a stop string, so a stop
//! string is never emitted, even when it spans several tokens.

use switchyard_messages::Token;

/// What the filter decided after a token.
#[derive(Debug, PartialEq)]
pub enum StopCheck {
    /// These tokens are safe to emit; keep going.
    Continue(Vec<Token>),
    /// A stop string matched: emit these (the last may be cut short) and stop.
    Stopped(Vec<Token>),
}

/// Stop-string filter for one generation.
#[derive(Debug, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    pending: Vec<Token>,
    pending_text: String,
    /// The stop string that matched.
    matched: Option<String>,
}

impl StopFilter {
    /// A filter for these stop strings (empty ones are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            ..Default::default()
        }
    }

    /// Feeds one token; returns what can be released.
    pub fn push(&mut self, token: Token) -> StopCheck {
        if self.stops.is_empty() {
            return StopCheck::Continue(vec![token]);
        }
        self.pending_text.push_str(&token.text);
        self.pending.push(token);
        let first_match = self
            .stops
            .iter()
            .filter_map(|s| self.pending_text.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at);
        if let Some((cut, stop)) = first_match {
            self.matched = Some(stop.clone());
            let mut out = Vec::new();
            let mut offset = 0;
            for mut t in self.pending.drain(..) {
                if offset >= cut {
                    break;
                }
                let end = offset + t.text.len();
                if end > cut {
                    t.text.truncate(cut - offset);
                }
                offset = end;
                out.push(t);
            }
            self.pending_text.clear();
            return StopCheck::Stopped(out);
        }
        let hold = self.held_suffix_len();
        let safe_end = self.pending_text.len() - hold;
        let mut released = Vec::new();
        let mut offset = 0;
        while let Some(t) = self.pending.first() {
            if offset + t.text.len() > safe_end {
                break;
            }
            offset += t.text.len();
            released.push(self.pending.remove(0));
        }
        self.pending_text.drain(..offset);
        StopCheck::Continue(released)
    }

    /// The stop string that ended the generation (after [`StopCheck::Stopped`]).
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Releases everything held (the generation ended for another reason).
    pub fn flush(&mut self) -> Vec<Token> {
        self.pending_text.clear();
        std::mem::take(&mut self.pending)
    }

    /// Length of the longest suffix of the pending text that is a proper prefix of a
    /// stop string.
    fn held_suffix_len(&self) -> usize {
        let text = &self.pending_text;
        let mut best = 0;
        for s in &self.stops {
            for (i, _) in text.char_indices() {
                let suffix = &text[i..];
                if suffix.len() > best && suffix.len() < s.len() && s.starts_with(suffix) {
                    best = suffix.len();
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u32, s: &str) -> Token {
        Token {
            id,
            text: s.into(),
            logprob: None,
            reasoning: false,
        }
    }

    #[test]
    fn stop_across_tokens_is_not_emitted() {
        let mut f = StopFilter::new(&["END".into()]);
        assert_eq!(f.push(t(1, "ab")), StopCheck::Continue(vec![t(1, "ab")]));
        assert_eq!(f.push(t(2, "cE")), StopCheck::Continue(vec![]));
        assert_eq!(f.push(t(3, "N")), StopCheck::Continue(vec![]));
        assert_eq!(f.push(t(4, "Dx")), StopCheck::Stopped(vec![t(2, "c")]));
        assert_eq!(f.matched(), Some("END"));
    }

    #[test]
    fn false_start_is_released() {
        let mut f = StopFilter::new(&["END".into()]);
        assert_eq!(f.push(t(1, "E")), StopCheck::Continue(vec![]));
        assert_eq!(f.push(t(2, "x")), StopCheck::Continue(vec![t(1, "E"), t(2, "x")]));
        assert_eq!(f.push(t(3, "EN")), StopCheck::Continue(vec![]));
        assert_eq!(f.flush(), vec![t(3, "EN")]);
    }

    #[test]
    fn no_stops_passes_through() {
        let mut f = StopFilter::new(&[]);
        assert_eq!(f.push(t(1, "END")), StopCheck::Continue(vec![t(1, "END")]));
    }
}
