//! Metadata values: the thirteen GGUF value types, scalar values and typed arrays.

use std::fmt;

/// A GGUF metadata value type, with the numeric id files store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type with GGUF id `id`, or `None` for an unknown id.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The numeric id stored in GGUF files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Lower-case name (`"u32"`, `"string"`, `"array"`).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Bytes one value of a fixed-size type occupies; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one value of this type can occupy in a file (a string is at least its
    /// 8-byte length, an array its 4-byte element type and 8-byte count).
    pub fn min_encoded_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            fixed => fixed.fixed_size().unwrap_or(1),
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Array),
}

impl Value {
    /// The value's GGUF type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// A description of the type for error messages: `"u32"`, or `"array of string"`.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(array) => array.type_description(),
            scalar => scalar.value_type().name().to_string(),
        }
    }

    /// The value as `i128` when it is an integer of any width.
    pub(crate) fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value when it is an integer (any width) that is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_integer().and_then(|v| u64::try_from(v).ok())
    }

    /// The value when it is an integer (any width) that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_integer().and_then(|v| i64::try_from(v).ok())
    }

    /// The value when it is a float (`F32` widened, or `F64`).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The value when it is a boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The value when it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(v) => Some(v),
            _ => None,
        }
    }

    /// The value when it is an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// A typed array: a 150k-entry token list is one `Vec<String>`, not 150k [`Value`]s.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    /// An array of arrays; each inner array may have its own element type.
    Array(Vec<Array>),
}

impl Array {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::F64(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The type of the elements.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F32(_) => ValueType::F32,
            Array::F64(_) => ValueType::F64,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
        }
    }

    /// A description of the type for error messages: `"array of i32"`.
    pub fn type_description(&self) -> String {
        format!("array of {}", self.element_type())
    }

    /// Levels of arrays: 1 for an array of scalars or strings, 2 for an array of such arrays.
    pub fn depth(&self) -> usize {
        match self {
            Array::Array(inner) => 1 + inner.iter().map(Array::depth).max().unwrap_or(0),
            _ => 1,
        }
    }

    /// An empty array with room for `capacity` elements of `element_type`.
    pub(crate) fn with_capacity(element_type: ValueType, capacity: usize) -> Array {
        match element_type {
            ValueType::U8 => Array::U8(Vec::with_capacity(capacity)),
            ValueType::I8 => Array::I8(Vec::with_capacity(capacity)),
            ValueType::U16 => Array::U16(Vec::with_capacity(capacity)),
            ValueType::I16 => Array::I16(Vec::with_capacity(capacity)),
            ValueType::U32 => Array::U32(Vec::with_capacity(capacity)),
            ValueType::I32 => Array::I32(Vec::with_capacity(capacity)),
            ValueType::U64 => Array::U64(Vec::with_capacity(capacity)),
            ValueType::I64 => Array::I64(Vec::with_capacity(capacity)),
            ValueType::F32 => Array::F32(Vec::with_capacity(capacity)),
            ValueType::F64 => Array::F64(Vec::with_capacity(capacity)),
            ValueType::Bool => Array::Bool(Vec::with_capacity(capacity)),
            ValueType::String => Array::String(Vec::with_capacity(capacity)),
            ValueType::Array => Array::Array(Vec::with_capacity(capacity)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_round_trip() {
        for id in 0..13 {
            let value_type = ValueType::from_id(id).expect("ids 0..=12 are defined");
            assert_eq!(value_type.id(), id);
            assert_eq!(
                Array::with_capacity(value_type, 0).element_type(),
                value_type
            );
        }
        assert_eq!(ValueType::from_id(13), None);
        assert_eq!(ValueType::Array.min_encoded_size(), 12);
    }

    #[test]
    fn integer_views_check_range() {
        assert_eq!(Value::I8(-1).as_u64(), None);
        assert_eq!(Value::I8(-1).as_i64(), Some(-1));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::F32(0.5).as_f64(), Some(0.5));
        assert_eq!(Value::F32(0.5).as_u64(), None);
        let nested = Array::Array(vec![Array::Array(vec![]), Array::U8(vec![])]);
        assert_eq!(
            (nested.depth(), nested.type_description()),
            (2, "array of array".into())
        );
    }
}
