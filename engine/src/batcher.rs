//! Continuous batching on the compute thread (the BatcherActor's engine half).
//!
//! Every generation holds one KV slot. New jobs are admitted between decode steps
//! while a slot is free (their prompt is prefilled, reusing whatever prefix a slot
//! already holds); then one forward pass advances every running generation by one
//! token, each with its own sampler, stop strings, limits, deadline and cancel flag.
//! A generation that finishes frees its slot before the next step. Jobs that find no
//! free slot wait in arrival order; the worker's admission bounds how many can.
//!
//! Chunked prefill: a prompt that arrives while others generate is not prefilled in
//! one go (which would stall every running stream for the whole prefill). It is fed
//! a chunk per step, its chunk riding in the same forward pass as the running
//! streams' tokens, until its last chunk yields its first token. The chunk costs about
//! one decode step ([`super::chunking::ChunkBudget`]), so a running stream's inter-token
//! time at most about doubles while a long prompt comes in. Chunking changes no result:
//! a row's arithmetic does not depend on the rows beside it, nor attention on the split.

use super::chunking::ChunkBudget;
use super::compute::{guarded, now_ms, rate, ComputeState, GenerateJob, Job};
use super::constraint::Guide;
use super::model::forward::SeqStep;
use super::sampler::{token_logprob, Sampler};
use super::speculate::{Drafter, Mode, Prior, StepCosts};
use super::stops::{StopCheck, StopFilter};
use super::text::tokenizer::StreamDecoder;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::Instant;
use switchyard_backend::{BackendError, GenerateEvent, Prompt};
use switchyard_messages::{FinishReason, GenerateMetrics, Token};

/// A generation in progress: its slot and everything it samples with.
struct Running {
    job: GenerateJob,
    slot: usize,
    started: Instant,
    decode_start: Instant,
    metrics: GenerateMetrics,
    sampler: Sampler,
    /// Prompt plus generated tokens; the last one is fed to the next step.
    history: Vec<u32>,
    decoder: StreamDecoder,
    stops: StopFilter,
    /// The request's constraint, when it has one: only tokens it allows are sampled.
    guide: Option<Guide>,
    generated: usize,
    max_tokens: usize,
    /// Proposes tokens for the next step to check (speculative decoding).
    drafter: Drafter,
    /// The next step's tokens: the last one sampled, then any drafts.
    feed: Vec<u32>,
    /// Tokens the draft model should propose for the next step.
    want: usize,
}

impl Running {
    fn send(&self, ev: GenerateEvent) -> bool {
        self.job.events.send(Ok(ev)).is_ok()
    }

    fn set_decode(&mut self) {
        let m = &mut self.metrics;
        m.generated_tokens = self.generated as u32;
        m.decode_us = self.decode_start.elapsed().as_micros() as u64;
        m.prefill_tokens_per_sec = rate((m.prompt_tokens - m.cached_tokens) as u64, m.prefill_us);
        // The first token comes from the prefill's logits; decode rate counts the rest.
        m.decode_tokens_per_sec = rate(self.generated.saturating_sub(1) as u64, m.decode_us);
        m.draft_tokens = self.drafter.drafted;
        m.accepted_tokens = self.drafter.accepted;
    }

    /// Sends the held tokens and `Done`, and records the metrics.
    fn finish(&mut self, reason: FinishReason, tail: Vec<Token>, engine: &ComputeState) {
        self.set_decode();
        for t in tail {
            self.send(GenerateEvent::Token(t));
        }
        let mut m = self.metrics.clone();
        m.total_us = self.started.elapsed().as_micros() as u64 + m.queue_us;
        // On a GPU the memory that matters is the device's, from its driver.
        let (peak, active) = match engine.model.device_memory() {
            Some((active, peak)) => (peak, active),
            None => switchyard_fabric::host::process_memory(None),
        };
        m.peak_memory_bytes = peak;
        m.active_memory_bytes = active;
        *engine.last_metrics.lock().unwrap_or_else(|p| p.into_inner()) = m.clone();
        // Before `Done`: the worker reads what the slots hold as the stream ends.
        engine.publish_holdings(Some((self.slot, &self.history)));
        self.send(GenerateEvent::Done {
            finish_reason: reason,
            metrics: m,
        });
    }

    /// Ends at the length limit or on cancel: flushes the stop filter and UTF-8 decoder.
    fn finish_flushed(&mut self, reason: FinishReason, engine: &ComputeState) {
        let mut tail = self.stops.flush();
        let rest = self.decoder.finish();
        if !rest.is_empty() {
            // An unfinished UTF-8 sequence at the very end: attach its replacement
            // character to the last held token (if everything was already sent, the
            // fragment is dropped rather than sent under a duplicate token id).
            if let Some(t) = tail.last_mut() {
                t.text.push_str(&rest);
            }
        }
        self.finish(reason, tail, engine);
    }

    /// Samples from `logits` and emits; true while the generation goes on.
    fn advance(&mut self, mut logits: Vec<f32>, engine: &ComputeState) -> bool {
        // The raw logits, for log-probabilities: sampling changes them in place.
        let raw = self.job.config.logprobs.map(|_| logits.clone());
        let next = match &mut self.guide {
            None => self.sampler.sample(&mut logits, &self.history),
            Some(guide) => match guide.sample(&mut self.sampler, logits, &self.history) {
                Ok(t) => t,
                Err(e) => {
                    let _ = self.job.events.send(Err(e));
                    return false;
                }
            },
        };
        let cfg = &self.job.config;
        if engine.tokenizer.eog_ids().contains(&next) || cfg.stop_tokens.contains(&next) {
            // Text the stop-string filter held back (it might have begun a match)
            // is the generation's end, not a match: send it.
            self.finish_flushed(FinishReason::Stop, engine);
            return false;
        }
        self.history.push(next);
        self.generated += 1;
        let text = self.decoder.push(engine.tokenizer.token_bytes(next));
        let top = self.job.config.logprobs.unwrap_or(0) as usize;
        let logprob = raw.map(|raw| token_logprob(&raw, next, top, |id| engine.tokenizer.token_bytes(id)));
        match self.stops.push(Token {
            logprob,
            ..Token::new(next, text)
        }) {
            StopCheck::Continue(tokens) => {
                for t in tokens {
                    if !self.send(GenerateEvent::Token(t)) {
                        self.job.cancel.cancel();
                    }
                }
            }
            StopCheck::Stopped(tokens) => {
                self.metrics.stop_sequence = self.stops.matched().map(str::to_string);
                self.finish(FinishReason::Stop, tokens, engine);
                return false;
            }
        }
        if self.guide.as_ref().is_some_and(Guide::is_done) {
            // The constraint is complete and allows nothing more (not even text
            // before end-of-generation): the answer is whole.
            self.finish_flushed(FinishReason::Stop, engine);
            return false;
        }
        if self.generated >= self.max_tokens {
            self.finish_flushed(FinishReason::Length, engine);
            return false;
        }
        if self.job.cancel.is_cancelled() {
            self.finish_flushed(FinishReason::Cancelled, engine);
            return false;
        }
        if self.job.deadline_ms.is_some_and(|d| now_ms() >= d) {
            let _ = self.job.events.send(Err(BackendError::DeadlineExceeded));
            return false;
        }
        true
    }

    /// Sets the next step's tokens: the last sampled one and what the drafter
    /// proposes after it (never more than the stream may still generate), given
    /// `cost(k)`, the estimated time of the step with `k` more positions.
    fn plan(&mut self, cost: impl Fn(usize) -> Option<f64>) {
        let last = *self.history.last().expect("a running stream has a history");
        let room = self.max_tokens.saturating_sub(self.generated + 1);
        self.feed.clear();
        self.feed.push(last);
        self.want = 0;
        match self.drafter.mode() {
            Mode::Off => {}
            Mode::Lookup => {
                let drafts = self.drafter.draft(&self.history, self.generated, room, cost);
                self.feed.extend(drafts);
            }
            Mode::Draft => self.want = self.drafter.wanted(self.generated, room, cost),
        }
    }

    /// Samples from the logits of each fed position in turn, exactly as plain
    /// decoding would, while the sampled token is the one drafted next (so its
    /// keys and values are already computed); true while the generation goes on.
    fn verify(&mut self, rows: impl Iterator<Item = Vec<f32>>, engine: &ComputeState, prior: &mut Prior) -> bool {
        let drafted = self.feed.len() - 1;
        // Counted as they go: a stream that ends in this step reports its metrics
        // from inside `advance`.
        self.drafter.drafted += drafted as u32;
        let mut accepted = 0;
        let mut going = true;
        for (i, logits) in rows.enumerate() {
            going = self.advance(logits, engine);
            if !going || i == drafted || self.history.last() != Some(&self.feed[i + 1]) {
                break;
            }
            accepted += 1;
            self.drafter.accepted += 1;
        }
        self.drafter.observe(drafted, accepted, self.generated);
        prior.observe(drafted, accepted);
        going
    }
}

/// A generation whose prompt is being fed a chunk per step.
struct Prefill {
    run: Running,
    /// Prompt tokens already in its slot.
    fed: usize,
    began: Instant,
}

/// The compute thread's scheduler.
pub struct Batcher {
    engine: ComputeState,
    jobs: mpsc::Receiver<Job>,
    waiting: VecDeque<Job>,
    running: Vec<Running>,
    /// Generations whose prompts are fed a chunk per step, first come first.
    prefilling: VecDeque<Prefill>,
    budget: ChunkBudget,
    /// What steps cost by their positions, for choosing how many tokens to draft.
    costs: StepCosts,
    /// Acceptance of recent drafts, a new stream's first guess of its own.
    prior: Prior,
}

impl Batcher {
    pub fn new(engine: ComputeState, jobs: mpsc::Receiver<Job>) -> Self {
        let budget = ChunkBudget::new(engine.prefill_chunk);
        Self {
            engine,
            jobs,
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefilling: VecDeque::new(),
            budget,
            costs: StepCosts::default(),
            prior: Prior::default(),
        }
    }

    /// Runs until every job sender is gone and the last generation has finished.
    pub fn run(mut self) {
        loop {
            if self.running.is_empty() && self.prefilling.is_empty() && self.waiting.is_empty() {
                match self.jobs.recv() {
                    Ok(job) => self.accept(job),
                    Err(_) => return,
                }
            }
            while let Ok(job) = self.jobs.try_recv() {
                self.accept(job);
            }
            self.admit();
            if !self.running.is_empty() || !self.prefilling.is_empty() {
                self.step();
            }
            self.engine.publish_usage();
        }
    }

    /// Session calls and session decodes run at once (their slot is theirs); other
    /// jobs queue for a free slot.
    fn accept(&mut self, job: Job) {
        match job {
            Job::Session(op) => self.engine.session_op(op),
            Job::Kv(op) => self.engine.kv_op(op),
            Job::Generate(g) if g.session_slot.is_some() => self.start(*g),
            other => self.waiting.push_back(other),
        }
    }

    /// Starts waiting jobs, in order, while a slot is free.
    fn admit(&mut self) {
        while self.engine.free_slots() > 0 {
            let Some(job) = self.waiting.pop_front() else { return };
            match job {
                Job::Generate(g) => self.start(*g),
                Job::Session(op) => self.engine.session_op(op),
                Job::Kv(op) => self.engine.kv_op(op),
                Job::Inspect {
                    prompt,
                    architecture,
                    reply,
                } => {
                    let result = guarded(|| self.engine.inspect(&prompt, architecture));
                    let _ = reply.send(result);
                }
                Job::Classify {
                    prompts,
                    return_logits,
                    reply,
                } => {
                    let _ = reply.send(self.engine.classify(&prompts, return_logits));
                }
                Job::Embed { inputs, reply } => {
                    let _ = reply.send(self.engine.embed(&inputs));
                }
            }
        }
    }

    /// Prefills a generation in a free slot and samples its first token.
    fn start(&mut self, job: GenerateJob) {
        let started = Instant::now();
        let mut metrics = GenerateMetrics {
            queue_us: started.duration_since(job.enqueued).as_micros() as u64,
            ..Default::default()
        };
        let fail = |job: &GenerateJob, e: BackendError| {
            let _ = job.events.send(Err(e));
        };
        let prompt = match job.session_slot {
            // A session decodes from what its slot holds.
            Some(slot) => match self.engine.slots.get(slot) {
                Some(s) if s.pinned && !s.busy => Ok((s.resident.clone(), None)),
                Some(s) if s.busy => Err(BackendError::Invalid("the session is already decoding".into())),
                _ => Err(BackendError::Invalid(format!("slot {slot} is not a session's"))),
            },
            None => self.engine.tokenize_mapped(&job.prompt, true),
        };
        let (prompt, map) = match prompt {
            Ok(p) => p,
            Err(e) => return fail(&job, e),
        };
        if let Err(e) = self.engine.check_logit_bias(&job.config) {
            return fail(&job, e);
        }
        let max_tokens = match self.engine.max_tokens(&prompt, &job.config) {
            Ok(n) => n,
            Err(e) => return fail(&job, e),
        };
        let mut guide = match &job.config.constraint {
            None => None,
            Some(c) => match self.engine.grammars.compile(c) {
                Ok(g) => Some(g),
                Err(e) => return fail(&job, e),
            },
        };
        if let (Some(g), Prompt::Continue { generated, .. }) = (&mut guide, &job.prompt) {
            if let Err(e) = g.replay(generated) {
                return fail(&job, e);
            }
        }
        metrics.prompt_tokens = prompt.len() as u32;
        let claimed = match job.session_slot {
            Some(slot) => {
                // Everything is resident; the last token runs again for its logits.
                self.engine.slots[slot].busy = true;
                Some((slot, prompt.len() - 1))
            }
            None => self.engine.claim(&prompt, job.adapter.as_ref()),
        };
        let Some((slot, reused)) = claimed else {
            return fail(&job, BackendError::Unavailable("no free KV slot".into()));
        };
        self.engine.slots[slot].map = map; // what it held before is gone: say so
        self.engine.publish_holdings(None);
        let mut run = Running {
            slot,
            started,
            decode_start: started,
            metrics,
            sampler: Sampler::new(&job.config),
            history: prompt,
            decoder: StreamDecoder::default(),
            stops: StopFilter::new(&job.config.stop),
            guide,
            generated: 0,
            max_tokens,
            drafter: Drafter::new(self.engine.speculative, self.engine.draft_max, self.prior.acceptance()),
            feed: Vec::new(),
            want: 0,
            job,
        };
        // A resumed stream: its earlier tokens' bytes prime the UTF-8 decoder, so a
        // character split across the break comes out whole.
        if let Prompt::Continue { generated, .. } = &run.job.prompt {
            for &t in generated {
                run.decoder.push(self.engine.tokenizer.token_bytes(t));
            }
        }
        if run.job.cancel.is_cancelled() || run.job.events.is_closed() {
            run.finish(FinishReason::Cancelled, Vec::new(), &self.engine);
            self.engine.release(slot);
            return;
        }
        run.metrics.cached_tokens = reused as u32;
        let t0 = Instant::now();
        let prefill = Prefill {
            run,
            fed: reused,
            began: t0,
        };
        if !self.running.is_empty() || !self.prefilling.is_empty() {
            // Others are generating: this prompt goes in chunks between their steps.
            self.prefilling.push_back(prefill);
            return;
        }
        let Prefill { run, .. } = prefill;
        let logits = self
            .engine
            .forward(&[SeqStep::new(slot, &run.history[reused..], reused)]);
        let fed = run.history.len() - reused;
        self.budget.observe(0, fed, t0.elapsed().as_micros() as f64);
        self.prefilled(run, t0, logits.map(|mut l| l.pop().unwrap_or_default()));
    }

    /// A generation's prompt is all in its slot and `logits` are its last token's:
    /// samples the first token, and the generation runs (or ends).
    fn prefilled(&mut self, mut run: Running, began: Instant, logits: Result<Vec<f32>, BackendError>) {
        run.metrics.prefill_us = began.elapsed().as_micros() as u64;
        run.decode_start = Instant::now();
        match logits {
            Ok(logits) => {
                if run.advance(logits, &self.engine) {
                    self.running.push(run);
                } else {
                    self.settle(&run);
                    self.engine.release(run.slot);
                }
            }
            Err(e) => {
                let _ = run.job.events.send(Err(e));
                self.engine.release(run.slot);
            }
        }
    }

    /// Ends prefills that were cancelled, abandoned or ran past their deadline.
    fn drop_stale_prefills(&mut self) {
        let mut keep = VecDeque::with_capacity(self.prefilling.len());
        while let Some(mut p) = self.prefilling.pop_front() {
            let job = &p.run.job;
            if job.cancel.is_cancelled() || job.events.is_closed() {
                p.run.finish(FinishReason::Cancelled, Vec::new(), &self.engine);
                self.engine.release(p.run.slot);
            } else if job.deadline_ms.is_some_and(|d| now_ms() >= d) {
                let _ = job.events.send(Err(BackendError::DeadlineExceeded));
                self.engine.release(p.run.slot);
            } else {
                keep.push_back(p);
            }
        }
        self.prefilling = keep;
    }

    /// A session's generated tokens all become resident: when its stream ended right
    /// after sampling (length, cancel, a stop string), the last sampled token has not
    /// been through the model yet, so it runs once, alone, for its keys and values.
    /// (A stop token is never resident: it is not part of the history.)
    fn settle(&mut self, run: &Running) {
        if run.job.session_slot.is_none() {
            return;
        }
        let have = self.engine.slots[run.slot].resident.len();
        if have + 1 == run.history.len() && run.history[..have] == self.engine.slots[run.slot].resident[..] {
            let step = SeqStep::new(run.slot, &run.history[have..], have);
            if let Err(e) = self.engine.forward(&[step]) {
                tracing::warn!(
                    slot = run.slot,
                    "session decode: the last token could not be made resident: {e}"
                );
            }
        }
    }

    /// One decode step: every running generation's last token, and the next chunk of
    /// the first prompt being prefilled, in one forward pass.
    fn step(&mut self) {
        self.drop_stale_prefills();
        // Each stream drafts given the positions planned before it (and, with a
        // draft model, what its passes cost).
        let mut planned = self.running.len();
        let pass_us = self.engine.draft.as_ref().map_or(0.0, |d| d.pass_us);
        for r in &mut self.running {
            r.plan(|k| self.costs.estimate(planned + k).map(|c| c + k as f64 * pass_us));
            planned += r.feed.len() - 1 + r.want;
        }
        if let Some(draft) = self.engine.draft.as_mut() {
            let wants: Vec<_> = self.running.iter().map(|r| (r.slot, &r.history[..], r.want)).collect();
            match draft.draft(&wants) {
                Ok(drafts) => self.running.iter_mut().zip(drafts).for_each(|(r, d)| r.feed.extend(d)),
                Err(e) => tracing::warn!("the draft model failed ({e}); this step checks no drafts"),
            }
        }
        // A stream's last token and its drafts; every position yields logits.
        let mut steps: Vec<SeqStep<'_>> = self
            .running
            .iter()
            .map(|r| SeqStep {
                seq: r.slot,
                tokens: &r.feed,
                pos: r.history.len() - 1,
                outputs: r.feed.len(),
            })
            .collect();
        let rows = steps.len();
        let mut chunk = 0;
        if let Some(p) = self.prefilling.front_mut() {
            // A prompt that arrived behind another with the same head takes what that
            // one has computed since.
            let fed = self.engine.take_longer_prefix(p.run.slot, &p.run.history, p.fed);
            if fed > p.fed {
                p.run.metrics.cached_tokens += (fed - p.fed) as u32;
                p.fed = fed;
            }
            // With nothing else running there is nothing to keep flowing: the rest of
            // the prompt goes at once.
            let budget = if rows == 0 { usize::MAX } else { self.budget.tokens() };
            let end = p.fed.saturating_add(budget).min(p.run.history.len());
            chunk = end - p.fed;
            steps.push(SeqStep::new(p.run.slot, &p.run.history[p.fed..end], p.fed));
        }
        if steps.is_empty() {
            return;
        }
        let stats = &self.engine.stats;
        stats.steps.fetch_add(1, Ordering::Relaxed);
        stats.rows.fetch_add(rows as u64, Ordering::Relaxed);
        stats.peak.fetch_max(rows as u64, Ordering::Relaxed);
        let t0 = Instant::now();
        let mut outcome = self.engine.forward(&steps);
        let took = t0.elapsed().as_micros() as f64;
        self.budget.observe(rows, chunk, took);
        self.costs.observe(planned + chunk, took);
        let running = std::mem::take(&mut self.running);
        if chunk > 0 {
            let mut p = self.prefilling.pop_front().expect("the chunk's prefill");
            p.fed += chunk;
            // The chunk's row is the last one; the running streams' come before it.
            let logits = match &mut outcome {
                Ok(all) => Ok(all.pop().unwrap_or_default()),
                Err(e) => Err(e.clone()),
            };
            if p.fed == p.run.history.len() || logits.is_err() {
                self.prefilled(p.run, p.began, logits);
            } else {
                self.prefilling.push_front(p);
            }
        }
        match outcome {
            Ok(all) => {
                let mut rows = all.into_iter();
                for mut run in running {
                    let n = run.feed.len();
                    let mine: Vec<Vec<f32>> = rows.by_ref().take(n).collect();
                    let going = run.verify(mine.into_iter(), &self.engine, &mut self.prior);
                    if n > 1 {
                        // Drafts it did not keep leave the slot's resident tokens.
                        self.engine.keep_resident(run.slot, &run.history);
                    }
                    if going {
                        self.running.push(run);
                    } else {
                        self.settle(&run);
                        self.engine.release(run.slot);
                    }
                }
            }
            Err(e) => {
                for run in running {
                    let _ = run.job.events.send(Err(e.clone()));
                    self.engine.release(run.slot);
                }
            }
        }
    }
}

/// Starts the compute thread with `threads` compute threads (0 = all cores); it
/// lives until every job sender is dropped. Generations run through
/// the [`Batcher`]: continuously batched, one slot each.
pub fn spawn(engine: ComputeState, threads: usize) -> std::io::Result<mpsc::Sender<Job>> {
    let (tx, rx) = mpsc::channel::<Job>();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("sy-compute-{i}"))
        .build()
        .map_err(std::io::Error::other)?;
    std::thread::Builder::new()
        .name("sy-engine".into())
        .spawn(move || pool.install(move || Batcher::new(engine, rx).run()))?;
    Ok(tx)
}
