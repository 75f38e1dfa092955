//! The calling thread's CPU time, for measurements taken on a busy machine.

#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
mod linux {
    #[repr(C)]
    struct Timespec {
        seconds: i64,
        nanoseconds: i64,
    }

    extern "C" {
        fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
    }

    /// Linux's clock of the calling thread's CPU time.
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

    pub fn thread_cpu_ns() -> Option<u64> {
        let mut time = Timespec {
            seconds: 0,
            nanoseconds: 0,
        };
        // SAFETY: `time` is a valid, writable timespec of the 64-bit layout, and the clock id
        // is Linux's thread CPU clock; the call writes nothing else.
        let status = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut time) };
        (status == 0).then(|| time.seconds as u64 * 1_000_000_000 + time.nanoseconds as u64)
    }
}

/// Nanoseconds the calling thread has run on a CPU (Linux's `CLOCK_THREAD_CPUTIME_ID`), or
/// `None` on other systems: a figure that stays meaningful on a machine shared with other
/// jobs, and that leaves out work a backend hands to threads of its own (lavapipe's).
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
pub fn thread_cpu_ns() -> Option<u64> {
    linux::thread_cpu_ns()
}

/// Nanoseconds the calling thread has run on a CPU: not told on this system.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
pub fn thread_cpu_ns() -> Option<u64> {
    None
}
