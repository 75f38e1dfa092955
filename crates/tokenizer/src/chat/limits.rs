//! Bounds on one rendering of a chat template: minijinja's fuel (instructions executed plus
//! about one per 64 bytes of data the template creates, so it bounds both time and memory)
//! and a cap on the rendered output, enforced by the writer the template renders into.

use std::fmt;
use std::io;

/// The limits one rendering runs under; see [`RenderLimits::DEFAULT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderLimits {
    /// minijinja fuel: one per instruction, plus about one per 64 bytes of strings, lists
    /// and output the template creates. Rendering stops with an error when it is used up.
    pub fuel: u64,
    /// Most bytes of rendered text.
    pub max_output_bytes: usize,
}

impl RenderLimits {
    /// Two million fuel (at most about 128 MB of data created, and a fraction of a second of
    /// work) and 8 MiB of output: real templates over a 4 MiB conversation use a small part
    /// of either.
    pub const DEFAULT: RenderLimits = RenderLimits {
        fuel: 2_000_000,
        max_output_bytes: 8 << 20,
    };
}

impl Default for RenderLimits {
    fn default() -> RenderLimits {
        RenderLimits::DEFAULT
    }
}

/// Which limit a rendering ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateLimit {
    /// The fuel ran out.
    Fuel(u64),
    /// The output grew past this many bytes.
    OutputBytes(usize),
}

impl fmt::Display for TemplateLimit {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TemplateLimit::Fuel(fuel) => write!(
                formatter,
                "the chat template ran out of its fuel limit of {fuel} (instructions and data)"
            ),
            TemplateLimit::OutputBytes(bytes) => write!(
                formatter,
                "the chat template's output exceeded its size limit of {bytes} bytes"
            ),
        }
    }
}

/// The writer a template renders into: it keeps at most `limit` bytes and fails the write
/// that would pass it.
pub(crate) struct LimitedOutput {
    bytes: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl LimitedOutput {
    pub(crate) fn new(limit: usize) -> LimitedOutput {
        LimitedOutput {
            bytes: Vec::new(),
            limit,
            exceeded: false,
        }
    }

    /// Whether a write was refused for passing the limit.
    pub(crate) fn exceeded(&self) -> bool {
        self.exceeded
    }

    /// The text written (minijinja writes only whole `str`s, so it is UTF-8).
    pub(crate) fn into_string(self) -> Result<String, std::string::FromUtf8Error> {
        String::from_utf8(self.bytes)
    }
}

impl io::Write for LimitedOutput {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        if self.bytes.len() + buffer.len() > self.limit {
            self.exceeded = true;
            return Err(io::Error::other("the chat template's output is too large"));
        }
        self.bytes.extend_from_slice(buffer);
        Ok(buffer.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::LimitedOutput;

    #[test]
    fn output_stops_at_the_limit() {
        let mut output = LimitedOutput::new(5);
        output.write_all(b"abc").expect("fits");
        assert!(output.write_all(b"def").is_err());
        assert!(output.exceeded());
        assert_eq!(output.into_string().expect("utf-8"), "abc");
    }
}
