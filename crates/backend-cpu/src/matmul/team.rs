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
        // checks the generation), and this function returns only once `done` counts every
        // chunk of it, so `work` outlives every use. That wait is skipped if `work` panics on
        // this thread: the unwind would leave while helpers may still run chunks.
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
        let mut mine = 0;
        while let Some(chunk) = claim(shared, generation) {
            work(chunk);
            mine += 1;
        }
        shared.done.fetch_add(mine, Ordering::AcqRel);
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
            unsafe { (*job.0)(chunk) };
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
