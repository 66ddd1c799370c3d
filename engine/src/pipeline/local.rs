//! [`LocalLink`]: a pipeline's later stages in this process, each on a thread —
//! what tests and benchmarks run a pipeline on without a network.

use super::{StageLink, StageServer, STAGE_VERSION};
use std::sync::mpsc::Receiver;
use switchyard_messages::stage::{rows_to_bytes, StageBatch, StageReply, StageReport};

/// A batch on its way through [`LocalLink`]'s stages: the reports of the stages
/// it passed and where the answer goes.
type LocalJob = (
    StageBatch,
    Vec<StageReport>,
    std::sync::mpsc::Sender<Result<StageReply, String>>,
);

/// A [`StageLink`] to stages in this process, each on a thread of its own: what
/// tests and benchmarks run a pipeline on without a network. As over NATS, a stage
/// passes rows on without waiting for the answer, which the last one sends
/// straight back.
pub struct LocalLink {
    tx: std::sync::mpsc::Sender<LocalJob>,
    max_bytes: usize,
}

impl LocalLink {
    /// A chain of `stages` (in layer order), each on its own thread; batches carry
    /// at most `max_bytes`.
    pub fn new(stages: Vec<StageServer>, max_bytes: usize) -> Self {
        let mut next: Option<std::sync::mpsc::Sender<LocalJob>> = None;
        for mut stage in stages.into_iter().rev() {
            let (tx, rx) = std::sync::mpsc::channel::<LocalJob>();
            let after = next.take();
            std::thread::spawn(move || {
                while let Ok((mut batch, mut reports, reply)) = rx.recv() {
                    let started = std::time::Instant::now();
                    let rows = match stage.run(&batch) {
                        Ok(rows) => rows,
                        Err(e) => {
                            let _ = reply.send(Ok(StageReply {
                                v: STAGE_VERSION,
                                rows: Vec::new(),
                                stages: reports,
                                error: Some(e),
                            }));
                            continue;
                        }
                    };
                    reports.push(StageReport {
                        worker_id: "local".into(),
                        first_layer: stage.span().start as u32,
                        last_layer: stage.span().end as u32 - 1,
                        compute_us: started.elapsed().as_micros() as u64,
                        rss_bytes: 0,
                    });
                    match &after {
                        Some(next) => {
                            batch.rows = rows_to_bytes(&rows);
                            if let Err(e) = next.send((batch, reports, reply)) {
                                let _ = e.0 .2.send(Err("a stage stopped".into()));
                            }
                        }
                        None => {
                            let _ = reply.send(Ok(StageReply {
                                v: STAGE_VERSION,
                                rows: rows_to_bytes(&rows),
                                stages: reports,
                                error: None,
                            }));
                        }
                    }
                }
            });
            next = Some(tx);
        }
        Self {
            tx: next.expect("at least one stage"),
            max_bytes,
        }
    }
}

impl StageLink for LocalLink {
    fn send(&self, batch: StageBatch) -> Receiver<Result<StageReply, String>> {
        let (tx, rx) = std::sync::mpsc::channel();
        if let Err(e) = self.tx.send((batch, Vec::new(), tx)) {
            let _ = e.0 .2.send(Err("the stages stopped".into()));
        }
        rx
    }

    fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}
