//! RESP2 framing for the pipelined connection, without I/O: commands packed into the bytes to
//! send, and whole replies cut from the front of the bytes received — a reply split across
//! reads waits for the rest, and a stream that is not RESP2 is an error, since nothing after it
//! can be framed.

use std::io;

use redis::{Cmd, Pipeline, RedisResult, Value};

/// Appends `cmd`, packed as Redis reads it.
pub(super) fn pack_command(cmd: &Cmd, out: &mut Vec<u8>) {
    cmd.write_packed_command(out);
}

/// Appends every command of `pipeline`, one after another.
pub(super) fn pack_pipeline(pipeline: &Pipeline, out: &mut Vec<u8>) {
    out.extend_from_slice(&pipeline.get_packed_pipeline());
}

/// The reply at the start of `buf` and the bytes it takes, or `None` while it is incomplete.
/// An error reply from Redis (`-ERR …`) is a reply like any other, in the value.
pub(super) fn next_reply(buf: &[u8]) -> io::Result<Option<(RedisResult<Value>, usize)>> {
    let Some(len) = reply_len(buf)? else { return Ok(None) };
    Ok(Some((redis::parse_redis_value(&buf[..len]), len)))
}

/// The length of the RESP2 reply at the start of `buf`, or `None` while it is incomplete.
fn reply_len(buf: &[u8]) -> io::Result<Option<usize>> {
    let (mut at, mut pending) = (0, 1usize);
    while pending > 0 {
        let Some(kind) = buf.get(at) else { return Ok(None) };
        let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") else { return Ok(None) };
        let header = &buf[at + 1..at + eol];
        at += eol + 2;
        pending -= 1;
        match kind {
            b'+' | b'-' | b':' => {}
            b'$' => {
                if let Ok(len) = usize::try_from(number(header)?) {
                    at += len + 2;
                    if at > buf.len() {
                        return Ok(None);
                    }
                }
            }
            b'*' => {
                let count = usize::try_from(number(header)?).unwrap_or(0);
                pending = pending.checked_add(count).ok_or_else(|| protocol("more elements than memory holds"))?;
            }
            _ => return Err(protocol("not a RESP2 reply")),
        }
    }
    Ok(Some(at))
}

fn number(header: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(header).ok().and_then(|s| s.parse().ok()).ok_or_else(|| protocol("a bad length"))
}

/// A stream out of step with the protocol: the connection cannot be used any more.
pub(super) fn protocol(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("Redis protocol: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_lengths_are_found_whole_or_not_at_all() {
        let replies: [&[u8]; 8] = [
            b":42\r\n",
            b"-NOSCRIPT No matching script\r\n",
            b"+OK\r\n",
            b"$-1\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n:1\r\n*2\r\n$3\r\nabc\r\n:-7\r\n$0\r\n\r\n",
        ];
        for reply in replies {
            let mut stream = reply.to_vec();
            stream.extend_from_slice(b":1\r\n");
            assert_eq!(reply_len(&stream).expect("RESP2"), Some(reply.len()), "{:?}", String::from_utf8_lossy(reply));
            for cut in 0..reply.len() {
                assert_eq!(reply_len(&reply[..cut]).expect("RESP2"), None, "cut at {cut} of {:?}", reply);
            }
            assert!(redis::parse_redis_value(reply).is_ok());
        }
        assert!(reply_len(b"?what\r\n").is_err());
        assert!(reply_len(b"$x\r\n").is_err());
    }

    #[test]
    fn replies_are_cut_one_at_a_time_with_their_values() {
        let stream = b"*2\r\n*2\r\n:1\r\n$3\r\nabc\r\n*0\r\n-NOSCRIPT No matching script\r\n:7\r\n:8";
        let mut at = 0;
        let mut next = || {
            let (value, len) = next_reply(&stream[at..]).expect("RESP2").expect("a whole reply");
            at += len;
            value
        };
        let nested = Value::Array(vec![
            Value::Array(vec![Value::Int(1), Value::BulkString(b"abc".to_vec())]),
            Value::Array(vec![]),
        ]);
        assert_eq!(next().expect("a value"), nested);
        let error = next().expect("a value").extract_error().expect_err("an error reply");
        assert_eq!(error.code(), Some("NOSCRIPT"));
        assert_eq!(next().expect("a value"), Value::Int(7));
        assert_eq!(next_reply(&stream[at..]).expect("RESP2").map(|(_, len)| len), None, "`:8` lacks its CRLF");
    }

    #[test]
    fn a_stream_that_is_not_resp2_is_an_error() {
        // Arrays nested past 2^64 elements in all: no Redis sends them, and counting them on
        // would wrap around and misframe the stream.
        let nested = format!("*{0}\r\n*{0}\r\n*{0}\r\n", i64::MAX);
        let bads = [
            &b"?what\r\n"[..],
            b"$x\r\n",
            b"*two\r\n",
            b"$99999999999999999999\r\n",
            b"*1\r\n!1\r\n",
            nested.as_bytes(),
        ];
        for bad in bads {
            let e = next_reply(bad).expect_err(&String::from_utf8_lossy(bad));
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        }
    }

    #[test]
    fn a_reply_announcing_more_than_arrived_waits_for_the_rest() {
        let bulk = format!("${}\r\nabc", i64::MAX);
        let array = format!("*{}\r\n:1\r\n", i64::MAX);
        for partial in [b"$10\r\nabc".as_slice(), bulk.as_bytes(), b"*3\r\n:1\r\n:2\r\n", array.as_bytes()] {
            assert!(next_reply(partial).expect("RESP2").is_none(), "{:?}", String::from_utf8_lossy(partial));
        }
    }

    #[test]
    fn packed_commands_frame_as_arrays_of_their_arguments() {
        let mut out = Vec::new();
        pack_command(redis::cmd("SET").arg("k").arg(b"v\r\n"), &mut out);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv\r\n\r\n");
        let mut pipeline = redis::pipe();
        pipeline.cmd("PING").cmd("GET").arg("k");
        pack_pipeline(&pipeline, &mut out);
        let mut lens = Vec::new();
        let mut at = 0;
        while let Some((value, len)) = next_reply(&out[at..]).expect("RESP2") {
            assert!(matches!(value, Ok(Value::Array(_))));
            lens.push(len);
            at += len;
        }
        assert_eq!((lens.len(), at), (3, out.len()), "SET, PING and GET, every byte framed");
    }
}
