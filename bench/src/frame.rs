//! Where a Locking-Center request frame ends (docs/protocol.md, lock port).
//! Sizes are signed bytes: a key is 1..=127 bytes, a source 0..=127.

#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// A whole frame of this many bytes is at the front of the buffer.
    Complete(usize),
    Incomplete,
    /// Unknown action or a bad size byte: answer `-` and close.
    Invalid,
}

/// Read a sized field at `at`; `min` is the smallest valid size.
fn field(buf: &[u8], at: usize, min: i8) -> Result<Option<usize>, ()> {
    let Some(&b) = buf.get(at) else {
        return Ok(None);
    };
    let size = b as i8;
    if size < min {
        return Err(());
    }
    Ok(Some(at + 1 + size as usize))
}

pub fn frame_len(buf: &[u8]) -> Frame {
    let Some(&action) = buf.first() else {
        return Frame::Incomplete;
    };
    // (key?, source?) per action.
    let (has_key, has_src) = match action {
        1 | 5 => (true, true),
        2 | 3 => (true, false),
        4 => (false, true),
        // Persist: the connection carries several requests (answered `+`).
        6 => return Frame::Complete(1),
        _ => return Frame::Invalid,
    };
    let mut at = 1;
    for (present, min) in [(has_key, 1i8), (has_src, 0i8)] {
        if !present {
            continue;
        }
        match field(buf, at, min) {
            Err(()) => return Frame::Invalid,
            Ok(None) => return Frame::Incomplete,
            Ok(Some(end)) => at = end,
        }
    }
    if buf.len() >= at {
        Frame::Complete(at)
    } else {
        Frame::Incomplete
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        assert_eq!(frame_len(b""), Frame::Incomplete);
        assert_eq!(frame_len(b"\x01\x03key\x03src"), Frame::Complete(9));
        assert_eq!(frame_len(b"\x01\x03key\x03sr"), Frame::Incomplete);
        assert_eq!(frame_len(b"\x01\x03key"), Frame::Incomplete);
        assert_eq!(frame_len(b"\x01\x03key\x00+"), Frame::Complete(6));
        assert_eq!(frame_len(b"\x02\x01k\x05"), Frame::Complete(3));
        assert_eq!(frame_len(b"\x03\x01k"), Frame::Complete(3));
        assert_eq!(frame_len(b"\x04\x00"), Frame::Complete(2));
        assert_eq!(frame_len(b"\x05\x01k\x01s"), Frame::Complete(5));
        assert_eq!(frame_len(b"\x09"), Frame::Invalid);
        assert_eq!(frame_len(b"\x01\x00"), Frame::Invalid, "empty key");
        assert_eq!(frame_len(b"\x01\x80"), Frame::Invalid, "negative key size");
        assert_eq!(
            frame_len(b"\x01\x01k\xff"),
            Frame::Invalid,
            "negative source size"
        );
    }
}
