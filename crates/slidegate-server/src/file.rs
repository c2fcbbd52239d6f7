//! Reading a configuration file (the rules file, an Envoy YAML file, a file to push): a
//! regular file only, of a bounded size, and never a wait on something that is not a file.
//!
//! The file is opened with `O_NONBLOCK` — opening a FIFO for reading would otherwise wait for
//! a writer for ever — and its type and size are taken from the opened handle, not from a
//! `stat` of the path that a rename could make stale before the open. A FIFO, a device, a
//! socket or a directory is refused before a byte is read; so is a file over its bound, and
//! the read stops at the bound should the file grow meanwhile.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::metrics;

/// Why a configuration file was not read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// It could not be opened or read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// It is not a regular file.
    #[error("a {0}, not a regular file: only regular files are read")]
    NotAFile(&'static str),
    /// It is over its bound.
    #[error("over the {max} bytes it may have")]
    TooLarge {
        /// The bound.
        max: usize,
    },
    /// It is not UTF-8 text.
    #[error("not UTF-8 text")]
    NotText,
}

/// The text of the regular file at `path`, of at most `max` bytes, to load it. A refusal (not
/// a regular file, too large) is counted in [`metrics::FILES_REFUSED`] under `kind` (`rules`,
/// `envoy`).
pub fn read_text(path: &Path, max: usize, kind: &'static str) -> Result<String, FileError> {
    let bytes = read(path, max).inspect_err(|e| count(e, kind))?;
    String::from_utf8(bytes).map_err(|_| FileError::NotText)
}

/// The bytes of the regular file at `path`, of at most `max`, uncounted: to look for a change.
pub fn read(path: &Path, max: usize) -> Result<Vec<u8>, FileError> {
    let file = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(FileError::NotAFile(kind_of(&meta.file_type())));
    }
    if meta.len() > max as u64 {
        return Err(FileError::TooLarge { max });
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // One byte past the bound tells a file that grew since its size was read.
    File::take(file, max as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > max {
        return Err(FileError::TooLarge { max });
    }
    Ok(bytes)
}

fn kind_of(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else {
        "special file"
    }
}

fn count(e: &FileError, kind: &'static str) {
    let reason = match e {
        FileError::NotAFile(_) => "not_a_file",
        FileError::TooLarge { .. } => "too_large",
        FileError::Io(_) | FileError::NotText => return,
    };
    ::metrics::counter!(metrics::FILES_REFUSED, "file" => kind, "reason" => reason).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_its_bound_is_read() {
        let dir = std::env::temp_dir().join(format!("slidegate-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("rules.toml");
        std::fs::write(&file, "12345").expect("write");
        assert_eq!(read_text(&file, 5, "rules").expect("within"), "12345");
        assert!(matches!(read_text(&file, 4, "rules"), Err(FileError::TooLarge { max: 4 })));
        assert!(matches!(read_text(&dir, 5, "rules"), Err(FileError::NotAFile("directory"))));
        std::fs::write(&file, [0xff, 0xfe]).expect("write");
        assert!(matches!(read_text(&file, 5, "rules"), Err(FileError::NotText)));
        let fifo = dir.join("fifo.yaml");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
        assert!(made.success());
        // Refused at once: no writer is waited for.
        assert!(matches!(read_text(&fifo, 5, "envoy"), Err(FileError::NotAFile("FIFO"))));
        std::fs::remove_dir_all(&dir).expect("clean");
    }
}
