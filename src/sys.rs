//! Every call into the C library, behind safe functions: the one module allowed
//! `unsafe` (`#![deny(unsafe_code)]` everywhere else; `tests/it/architecture.rs` checks).
//! Each `unsafe` block says why it is sound.

#![allow(unsafe_code)]

use std::fs::File;
use std::path::Path;

/// The open-files limit: (soft, hard).
pub fn fd_limits() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    // rlim_t is u64 on Linux, not everywhere.
    #[allow(clippy::unnecessary_cast)]
    Some((lim.rlim_cur as u64, lim.rlim_max as u64))
}

/// Raises the soft open-files limit to the hard one (as Go's runtime does); returns the
/// soft limit in force afterwards.
pub fn raise_fd_limit() -> Option<u64> {
    let (soft, hard) = fd_limits()?;
    if soft >= hard {
        return Some(soft);
    }
    let raised = libc::rlimit {
        rlim_cur: hard as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: setrlimit only reads the struct we pass, which lives for the call.
    let ok = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0;
    Some(if ok { hard } else { soft })
}

/// Makes glibc's allocator return buffers of at least `bytes` to the kernel when freed
/// (`M_MMAP_THRESHOLD`); a no-op elsewhere.
pub fn set_mmap_threshold(bytes: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes a tuning parameter of the allocator.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, bytes);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}

/// Free bytes available to this user on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; all-zero bytes are a valid value of it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `st` a valid out pointer, both live
    // for the call.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    (rc == 0).then(|| st.f_bavail as u64 * st.f_frsize as u64)
}

/// Clock ticks per second (`_SC_CLK_TCK`, the unit of `/proc/self/stat` times).
pub fn clock_ticks_per_second() -> i64 {
    // SAFETY: sysconf only reads a configuration value.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as i64 }
}

/// The memory page size in bytes (`_SC_PAGESIZE`, the unit of `/proc/self/stat` RSS).
pub fn page_size() -> i64 {
    // SAFETY: sysconf only reads a configuration value.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as i64 }
}

/// Takes an exclusive advisory lock on `file` without waiting: `Ok(false)` when another
/// process holds it. The kernel releases it when the descriptor closes or the process
/// dies.
pub fn try_lock_exclusive(file: &File) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a descriptor `file` owns for the duration of the call.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

/// CPU seconds the calling thread has run (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own, which lives for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Sends SIGTERM to a child process (not yet reaped, so its PID is still its own).
pub fn terminate(child: &std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) has no memory preconditions; the PID is our unreaped child's.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
}

/// True when an I/O error means the disk (or the user's quota) is full.
pub fn is_no_space(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrappers_answer() {
        let (soft, hard) = fd_limits().expect("getrlimit");
        assert!(soft <= hard);
        assert!(raise_fd_limit().is_some_and(|s| s >= soft));
        assert!(free_bytes(Path::new("/")).is_some());
        assert!(free_bytes(Path::new("/no/such/dir")).is_none());
        assert!(clock_ticks_per_second() > 0 && page_size() > 0);
        let t0 = thread_cpu_seconds();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1 && thread_cpu_seconds() >= t0);
        let dir = std::env::temp_dir().join(format!("promnorm-sys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lock");
        let a = File::create(&path).unwrap();
        let b = File::open(&path).unwrap();
        assert!(try_lock_exclusive(&a).unwrap(), "first holder");
        assert!(
            !try_lock_exclusive(&b).unwrap(),
            "a second descriptor waits"
        );
        drop(a);
        assert!(try_lock_exclusive(&b).unwrap(), "released on close");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(is_no_space(&std::io::Error::from_raw_os_error(
            libc::ENOSPC
        )));
        assert!(!is_no_space(&std::io::Error::from_raw_os_error(libc::EIO)));
    }
}
