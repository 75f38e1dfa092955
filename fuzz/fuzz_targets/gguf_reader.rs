//! Feeds arbitrary bytes to the GGUF reader; on success touches every metadata value and every
//! tensor's bytes, so a header the reader accepted but described wrongly would crash here.

#![no_main]

use libfuzzer_sys::fuzz_target;
use runit_gguf::{Array, GgufFile, Value};

fuzz_target!(|bytes: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(bytes.to_vec()) else {
        return;
    };
    let mut checksum = 0u64;
    for (key, value) in file.metadata() {
        checksum = checksum.wrapping_add(key.len() as u64);
        checksum = checksum.wrapping_add(touch_value(value));
        assert!(file.get(key).is_some(), "indexed key `{key}` not found");
        // The typed getters must answer (Ok or Err) for every key without panicking.
        let _ = file.get_u32(key);
        let _ = file.get_i64(key);
        let _ = file.get_f32(key);
        let _ = file.get_str(key);
        let _ = file.get_str_array(key);
    }
    assert!(file.data_offset() % file.alignment() == 0);
    for tensor in file.tensors() {
        let data = file.tensor_data(tensor);
        assert_eq!(data.len() as u64, tensor.n_bytes);
        assert!(tensor.offset % file.alignment() == 0);
        assert_eq!(file.tensor(&tensor.name), Some(tensor));
        checksum = checksum.wrapping_add(data.iter().map(|&b| u64::from(b)).sum::<u64>());
        checksum = checksum
            .wrapping_add(tensor.n_elements())
            .wrapping_add(tensor.n_rows());
    }
    std::hint::black_box(checksum);
});

fn touch_value(value: &Value) -> u64 {
    match value {
        Value::String(text) => text.len() as u64,
        Value::Array(array) => touch_array(array),
        scalar => scalar.as_u64().unwrap_or(0) ^ scalar.as_f64().map_or(0, f64::to_bits),
    }
}

fn touch_array(array: &Array) -> u64 {
    let length = array.len() as u64;
    length
        ^ match array {
            Array::String(strings) => strings.iter().map(|s| s.len() as u64).sum(),
            Array::Array(arrays) => arrays.iter().map(touch_array).sum(),
            Array::U8(values) => values.iter().map(|&v| u64::from(v)).sum(),
            Array::F32(values) => values.iter().map(|v| u64::from(v.to_bits())).sum(),
            Array::I8(values) => values.iter().map(|&v| v as u64).sum(),
            Array::U16(values) => values.iter().map(|&v| u64::from(v)).sum(),
            Array::I16(values) => values.iter().map(|&v| v as u64).sum(),
            Array::U32(values) => values.iter().map(|&v| u64::from(v)).sum(),
            Array::I32(values) => values.iter().map(|&v| v as u64).sum(),
            Array::U64(values) => values.iter().fold(0, |sum, &v| sum ^ v),
            Array::I64(values) => values.iter().fold(0, |sum, &v| sum ^ v as u64),
            Array::F64(values) => values.iter().fold(0, |sum, v| sum ^ v.to_bits()),
            Array::Bool(values) => values.iter().filter(|&&v| v).count() as u64,
        }
}
