//! A fork-join team for the matmul: the calling thread and `helpers` spinning threads
//! claim chunks of one job from a shared counter until none are left.
//!
//! A decode step runs about 200 matmuls of a few tens of microseconds each. Handing each to
//! a rayon pool from outside it (`install`) puts the caller to sleep on a condition
//! variable and wakes it through the kernel when the pool is done: two context switches per
//! matmul, milliseconds per token. Here the caller works on the job itself, helpers that
//! finished a job spin for a while before parking (as llama.cpp's threads do), and the
//! caller only waits for chunks that a helper already started, never for a helper to wake.
//!
//! Protocol: one atomic word holds the job's generation, its chunk count and the next
//! unclaimed chunk. A helper claims with a compare-and-swap that also checks the
//! generation, so a helper that fell asleep during an old job can never run a chunk of a
//! newer one, and it reads the job only after a successful claim, which the caller cannot
//! outlive (it waits until every chunk of its job is done).

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle helper spins before it parks.
const SPIN: Duration = Duration::from_micros(200);

const INDEX_BITS: u32 = 20;
const COUNT_BITS: u32 = 20;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// Most chunks one job may have.
pub(crate) const MAX_CHUNKS: usize = INDEX_MASK as usize;

/// `generation | count | next` packed into one word.
fn pack(generation: u64, count: usize, next: usize) -> u64 {
    (generation << (INDEX_BITS + COUNT_BITS)) | ((count as u64) << INDEX_BITS) | next as u64
}

fn generation_of(word: u64) -> u64 {
    word >> (INDEX_BITS + COUNT_BITS)
}

fn count_of(word: u64) -> usize {
    ((word >> INDEX_BITS) & COUNT_MASK) as usize
}

fn next_of(word: u64) -> usize {
    (word & INDEX_MASK) as usize
}

/// The job being run: a borrowed closure whose lifetime was erased (see `Team::run`).
type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// `generation | count | next`.
    claim: AtomicU64,
    /// Chunks of the current job that are finished.
    done: AtomicUsize,
    /// The current job (valid while a chunk of it is unfinished).
    job: Mutex<Option<JobCell>>,
    /// Per helper: parked (or about to park) and waiting for an unpark.
    sleeping: Vec<AtomicBool>,
    /// A chunk run by a helper panicked during the current job (the caller re-raises it).
    helper_panicked: AtomicBool,
}

/// A job pointer that may cross threads.
#[derive(Clone, Copy)]
struct JobCell(Job);
// SAFETY: the pointee is `Sync`, so calling it from another thread is sound; the pointer is
// only dereferenced under the protocol of the module documentation (see `Team::run`).
unsafe impl Send for JobCell {}

/// The caller's side of a team.
pub(crate) struct Team {
    shared: Arc<Shared>,
    threads: Vec<std::thread::Thread>,
    /// Serialises callers: one job at a time.
    running: Mutex<u64>,
}

impl Team {
    /// The process-wide team with `helpers` helper threads (started on first use).
    pub(crate) fn with_helpers(helpers: usize) -> Option<Arc<Team>> {
        static TEAMS: OnceLock<Mutex<Vec<Arc<Team>>>> = OnceLock::new();
        let mut teams = TEAMS.get_or_init(|| Mutex::new(Vec::new())).lock().ok()?;
        if let Some(team) = teams.iter().find(|team| team.threads.len() == helpers) {
            return Some(team.clone());
        }
        let team = Arc::new(Team::start(helpers)?);
        teams.push(team.clone());
        Some(team)
    }

    fn start(helpers: usize) -> Option<Team> {
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(0),
            done: AtomicUsize::new(0),
            job: Mutex::new(None),
            sleeping: (0..helpers).map(|_| AtomicBool::new(false)).collect(),
            helper_panicked: AtomicBool::new(false),
        });
        let mut threads = Vec::with_capacity(helpers);
        for index in 0..helpers {
            let shared = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("runit-matmul-{index}"))
                .spawn(move || helper(&shared, index))
                .ok()?;
            threads.push(handle.thread().clone());
        }
        Some(Team {
            shared,
            threads,
            running: Mutex::new(0),
        })
    }

    /// Runs `work(chunk)` for every `chunk < chunks`, on this thread and the helpers; returns
    /// when all are done. Runs everything here when another caller holds the team.
    pub(crate) fn run(&self, chunks: usize, work: &(dyn Fn(usize) + Sync)) {
        let Ok(mut generation) = self.running.try_lock() else {
            (0..chunks).for_each(work);
            return;
        };
        if chunks <= 1 || chunks > MAX_CHUNKS {
            (0..chunks).for_each(work);
            return;
        }
        let shared = &*self.shared;
        *generation += 1;
        let generation = *generation;
        // SAFETY: only the lifetime is erased (same pointee type). A helper dereferences the
        // pointer only while it holds a claimed, uncounted chunk of this generation (`claim`
        // checks the generation), and this function returns, normally or by unwinding, only
        // once `done` counts every chunk of it (a panic of `work` here is caught, the chunks
        // nobody claimed yet are taken and counted, and the wait runs before it is re-raised),
        // so `work` outlives every use.
        let job: Job = unsafe {
            std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Job>(
                work as *const (dyn Fn(usize) + Sync),
            )
        };
        *shared.job.lock().expect("the job slot is never poisoned") = Some(JobCell(job));
        shared.done.store(0, Ordering::Relaxed);
        shared
            .claim
            .store(pack(generation, chunks, 0), Ordering::SeqCst);
        for (thread, sleeping) in self.threads.iter().zip(&shared.sleeping) {
            if sleeping.load(Ordering::SeqCst) {
                thread.unpark();
            }
        }
        // Chunks claimed here (counted when claimed, so a chunk that panics is counted too).
        let mine = Cell::new(0);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            while let Some(chunk) = claim(shared, generation) {
                mine.set(mine.get() + 1);
                work(chunk);
            }
        }));
        if outcome.is_err() {
            // Nobody runs the chunks left unclaimed: count them as this thread's.
            while claim(shared, generation).is_some() {
                mine.set(mine.get() + 1);
            }
        }
        shared.done.fetch_add(mine.get(), Ordering::AcqRel);
        let mut spins = 0u32;
        while shared.done.load(Ordering::Acquire) < chunks {
            // A helper holding a chunk may have been preempted: let it have the core.
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if let Err(panic) = outcome {
            resume_unwind(panic);
        }
        if shared.helper_panicked.swap(false, Ordering::AcqRel) {
            panic!("a chunk of a matmul team job panicked on a helper thread");
        }
    }
}

/// Claims the next chunk of job `generation`, if any is left.
fn claim(shared: &Shared, generation: u64) -> Option<usize> {
    let mut word = shared.claim.load(Ordering::Acquire);
    loop {
        if generation_of(word) != generation || next_of(word) >= count_of(word) {
            return None;
        }
        match shared.claim.compare_exchange_weak(
            word,
            word + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(next_of(word)),
            Err(current) => word = current,
        }
    }
}

/// A helper thread: waits (spinning, then parked) for each new generation and claims its
/// chunks.
fn helper(shared: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let generation = wait_for_job(shared, index, seen);
        seen = generation;
        // Chunks finished here, added to `done` once after the last: the caller waits for
        // that sum, so it cannot return (and publish a newer job) before this thread's
        // chunks of `generation` are all counted, and the counter's cache line is not
        // fought over once per chunk.
        let mut finished = 0;
        let mut job = None;
        while let Some(chunk) = claim(shared, generation) {
            let job = *job.get_or_insert_with(|| {
                shared
                    .job
                    .lock()
                    .expect("the job slot is never poisoned")
                    .expect("a job is published before its chunks")
            });
            // SAFETY: this thread holds an unfinished chunk of `generation` (its finished
            // chunks are not counted yet), so the caller that published the job is still
            // inside `Team::run` and the closure is alive.
            let ran = catch_unwind(AssertUnwindSafe(|| unsafe { (*job.0)(chunk) }));
            if ran.is_err() {
                // Counted as finished all the same, so the caller stops waiting and re-raises.
                shared.helper_panicked.store(true, Ordering::Release);
            }
            finished += 1;
        }
        if finished > 0 {
            shared.done.fetch_add(finished, Ordering::AcqRel);
        }
    }
}

/// Returns the generation of the next job after `seen`.
fn wait_for_job(shared: &Shared, index: usize, seen: u64) -> u64 {
    let start = Instant::now();
    let mut spins = 0u32;
    loop {
        let generation = generation_of(shared.claim.load(Ordering::Acquire));
        if generation != seen {
            return generation;
        }
        spins += 1;
        if !spins.is_multiple_of(1024) || start.elapsed() < SPIN {
            std::hint::spin_loop();
            continue;
        }
        shared.sleeping[index].store(true, Ordering::SeqCst);
        if generation_of(shared.claim.load(Ordering::SeqCst)) == seen {
            std::thread::park();
        }
        shared.sleeping[index].store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_chunk_runs_once() {
        let team = Team::start(1).expect("a helper thread starts");
        let counts: Vec<AtomicUsize> = (0..100).map(|_| AtomicUsize::new(0)).collect();
        team.run(counts.len(), &|chunk| {
            counts[chunk].fetch_add(1, Ordering::Relaxed);
        });
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn a_panicking_chunk_is_raised_after_every_claimed_chunk_ended_and_the_team_still_works() {
        let team = Team::start(1).expect("a helper thread starts");
        for bad in [0, 37, 99] {
            let running = AtomicUsize::new(0);
            let outcome = catch_unwind(AssertUnwindSafe(|| {
                team.run(100, &|chunk| {
                    running.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_micros(50));
                    assert_ne!(chunk, bad, "planted failure");
                    running.fetch_sub(1, Ordering::SeqCst);
                });
            }));
            assert!(
                outcome.is_err(),
                "the panic of chunk {bad} reaches the caller"
            );
            // Only the panicking chunk may be left "running"; no chunk runs after the return.
            let after = running.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
            assert_eq!(running.load(Ordering::SeqCst), after);
            assert_eq!(after, 1);
        }
        let sum = AtomicUsize::new(0);
        team.run(10, &|chunk| {
            sum.fetch_add(chunk, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 45);
    }
}
