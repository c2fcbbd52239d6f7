//! Redis Cluster slots: a script may touch only keys of one slot, so the keys of one atomic
//! multi-limit check must share a hash tag ([`crate::key`] builds names that do).

/// The number of Redis Cluster hash slots.
pub const SLOTS: u16 = 16_384;

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag — the part between the first
/// `{` and the next `}`, when not empty — or of the whole key, modulo 16,384.
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    let bytes = key.as_ref();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            rest.iter().position(|&b| b == b'}').filter(|&len| len > 0).map(|len| &rest[..len])
        })
        .unwrap_or(bytes);
    crc16(hashed) % SLOTS
}

/// CRC-16/XMODEM (polynomial 0x1021, initial 0), the checksum Redis Cluster hashes keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // The check value of CRC-16/XMODEM, and slots from the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12_182);
        assert_eq!(key_slot("somekey"), 11_058);
        assert_eq!(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        // An empty tag hashes the whole key; only the first `{...}` counts.
        assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
        assert_eq!(key_slot("foo{bar}{zap}"), key_slot("bar"));
    }
}
