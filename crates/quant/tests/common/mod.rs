//! Test-only helpers: a minimal GGUF tensor-table reader (header, metadata skipped, tensor
//! infos, alignment) and the locations of the golden data and model files.
//!
//! The real reader lives in `runit-gguf`, which depends on this crate; this one exists so
//! the quant tests need no dependency cycle.

#![allow(dead_code)]

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use runit_quant::GgmlType;

/// `tests/golden` relative to the workspace root.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

/// Where a model file named `name` may be: the workspace's `models/` folder (fetched, or
/// rebuilt by the test script) and its `requant/` subfolder.
pub fn find_model(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [
        root.join("models").join(name),
        root.join("models/requant").join(name),
    ]
    .into_iter()
    .find(|path| path.is_file())
}

/// One entry of a GGUF tensor table.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    pub ty: GgmlType,
    /// ggml order: `ne[0]` is the row length.
    pub ne: Vec<u64>,
    /// Absolute file offset of the data.
    pub offset: u64,
    pub n_bytes: u64,
}

impl Tensor {
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
}

/// A GGUF file's tensor table and a handle to read tensor bytes.
pub struct Gguf {
    pub path: PathBuf,
    pub tensors: Vec<Tensor>,
    file: File,
}

struct Cursor<R> {
    inner: R,
}

impl<R: Read> Cursor<R> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut buffer = [0u8; N];
        self.inner.read_exact(&mut buffer).expect("truncated GGUF");
        buffer
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn string(&mut self) -> String {
        let len = self.u64() as usize;
        assert!(len < 1 << 24, "implausible string length {len}");
        let mut buffer = vec![0u8; len];
        self.inner.read_exact(&mut buffer).expect("truncated GGUF");
        String::from_utf8(buffer).expect("GGUF string is not UTF-8")
    }
    fn skip(&mut self, n: u64) {
        std::io::copy(&mut (&mut self.inner).take(n), &mut std::io::sink()).expect("skip");
    }
    /// Skips one metadata value of GGUF type `ty`; returns it when it is a u32.
    fn skip_value(&mut self, ty: u32) -> Option<u32> {
        match ty {
            0 | 1 | 7 => self.skip(1),
            2 | 3 => self.skip(2),
            4 => return Some(self.u32()),
            5 | 6 => self.skip(4),
            10..=12 => self.skip(8),
            8 => {
                let len = self.u64();
                self.skip(len);
            }
            9 => {
                let element = self.u32();
                let count = self.u64();
                for _ in 0..count {
                    self.skip_value(element);
                }
            }
            other => panic!("unknown GGUF value type {other}"),
        }
        None
    }
}

impl Gguf {
    pub fn open(path: &Path) -> Gguf {
        let file = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut cursor = Cursor {
            inner: BufReader::new(file.try_clone().expect("clone file handle")),
        };
        assert_eq!(
            &cursor.bytes::<4>(),
            b"GGUF",
            "{}: not GGUF",
            path.display()
        );
        let version = cursor.u32();
        assert!(version == 2 || version == 3, "GGUF version {version}");
        let n_tensors = cursor.u64();
        let n_kv = cursor.u64();
        let mut alignment = 32u64;
        for _ in 0..n_kv {
            let key = cursor.string();
            let ty = cursor.u32();
            let value = cursor.skip_value(ty);
            if key == "general.alignment" {
                alignment = u64::from(value.expect("general.alignment is a u32"));
            }
        }
        let mut tensors = Vec::new();
        for _ in 0..n_tensors {
            let name = cursor.string();
            let n_dims = cursor.u32();
            let ne: Vec<u64> = (0..n_dims).map(|_| cursor.u64()).collect();
            let id = cursor.u32();
            let ty = GgmlType::from_id(id).unwrap_or_else(|| panic!("{name}: type id {id}"));
            let offset = cursor.u64();
            let n_elements: u64 = ne.iter().product();
            let n_bytes = ty.row_bytes(n_elements).expect("whole blocks");
            tensors.push(Tensor {
                name,
                ty,
                ne,
                offset,
                n_bytes,
            });
        }
        let position = cursor.inner.stream_position().expect("position");
        let data_start = position.div_ceil(alignment) * alignment;
        for tensor in &mut tensors {
            tensor.offset += data_start;
        }
        Gguf {
            path: path.to_path_buf(),
            tensors,
            file,
        }
    }

    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of `tensor`.
    pub fn read(&self, tensor: &Tensor) -> Vec<u8> {
        let mut bytes = vec![0u8; tensor.n_bytes as usize];
        let mut file = &self.file;
        file.seek(SeekFrom::Start(tensor.offset)).expect("seek");
        file.read_exact(&mut bytes)
            .unwrap_or_else(|e| panic!("{}: {}: {e}", self.path.display(), tensor.name));
        bytes
    }

    /// The values of an F32 tensor.
    pub fn read_f32(&self, tensor: &Tensor) -> Vec<f32> {
        assert_eq!(tensor.ty, GgmlType::F32, "{}", tensor.name);
        self.read(tensor)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

/// The lines of a gzipped JSONL golden file, parsed.
pub fn read_jsonl_gz(path: &Path) -> Vec<serde_json::Value> {
    let file = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .expect("gunzip");
    text.lines()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .collect()
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
