//! Nests as TensorFlow encodes them (`StructuredValue`): table signatures and the structure of
//! structured-writer patterns, flattened in `tf.nest` order (dict keys sorted, named tuples in
//! field order) with each leaf's path, so the native writers check items against a table's
//! signature without TensorFlow.

use crate::tensor::dtype_name;
use crate::{ClientError, Result};
use prost::Message;
use reverb_proto::tensorflow::structured_value::Kind;
use reverb_proto::tensorflow::{StructuredValue, TensorShapeProto};
use reverb_proto::TableInfo;
use std::collections::HashMap;

/// One key of a leaf's path: a dict key or field name, or a sequence index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathKey {
    /// A dict key or named-tuple field.
    Name(String),
    /// A list or tuple index.
    Index(usize),
}

/// A leaf's path as Python prints it (`('obs', 0)`; `()` for a bare leaf).
pub fn path_string(path: &[PathKey]) -> String {
    let keys: Vec<String> = path
        .iter()
        .map(|k| match k {
            PathKey::Name(n) => format!("'{n}'"),
            PathKey::Index(i) => i.to_string(),
        })
        .collect();
    match keys.len() {
        1 => format!("({},)", keys[0]),
        _ => format!("({})", keys.join(", ")),
    }
}

/// The leaves of `value` in `tf.nest` order, with their paths.
pub fn flatten(value: &StructuredValue) -> Vec<(Vec<PathKey>, &StructuredValue)> {
    fn walk<'a>(
        value: &'a StructuredValue,
        path: &mut Vec<PathKey>,
        out: &mut Vec<(Vec<PathKey>, &'a StructuredValue)>,
    ) {
        let mut each = |key: PathKey, child: &'a StructuredValue, out: &mut Vec<_>| {
            path.push(key);
            walk(child, path, out);
            path.pop();
        };
        match &value.kind {
            Some(Kind::ListValue(l)) => {
                for (i, v) in l.values.iter().enumerate() {
                    each(PathKey::Index(i), v, out);
                }
            }
            Some(Kind::TupleValue(t)) => {
                for (i, v) in t.values.iter().enumerate() {
                    each(PathKey::Index(i), v, out);
                }
            }
            Some(Kind::DictValue(d)) => {
                let mut keys: Vec<&String> = d.fields.keys().collect();
                keys.sort();
                for k in keys {
                    each(PathKey::Name(k.clone()), &d.fields[k], out);
                }
            }
            Some(Kind::NamedTupleValue(t)) => {
                for pair in &t.values {
                    if let Some(v) = &pair.value {
                        each(PathKey::Name(pair.key.clone()), v, out);
                    }
                }
            }
            _ => out.push((path.clone(), value)),
        }
    }
    let mut out = Vec::new();
    walk(value, &mut Vec::new(), &mut out);
    out
}

/// One leaf of a table signature: dtype and shape (`None`: unknown rank; `-1`: unknown size).
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// Where the leaf sits in the signature.
    pub path: String,
    /// Its name: the spec's own, else its path joined by `/` (`obs/x`), as the reference's.
    pub name: String,
    /// TensorFlow `DataType`.
    pub dtype: i32,
    /// Dimensions, `None` when the rank is unknown.
    pub shape: Option<Vec<i64>>,
}

fn shape_of(shape: Option<&TensorShapeProto>) -> Option<Vec<i64>> {
    match shape {
        None => Some(Vec::new()),
        Some(s) if s.unknown_rank => None,
        Some(s) => Some(s.dim.iter().map(|d| d.size).collect()),
    }
}

impl Spec {
    /// Whether rows of `dtype` and `shape` fit this spec.
    pub fn accepts(&self, dtype: i32, shape: &[i64]) -> bool {
        self.dtype == dtype
            && self.shape.as_ref().is_none_or(|want| {
                want.len() == shape.len() && want.iter().zip(shape).all(|(&w, &g)| w < 0 || w == g)
            })
    }

    /// `float32[3, ?]`, as errors print a spec.
    pub fn describe(&self) -> String {
        match &self.shape {
            None => format!("{}[<unknown rank>]", dtype_name(self.dtype)),
            Some(dims) => describe(self.dtype, &dims.to_vec()),
        }
    }
}

/// `int32[2, 3]` (`?` for unknown sizes).
pub fn describe(dtype: i32, shape: &[i64]) -> String {
    format!("{}{}", dtype_name(dtype), dims(shape))
}

/// The flat specs of a serialized signature (`TableInfo.signature`); `None` when the table has
/// none.
pub fn decode_signature(bytes: &[u8]) -> Result<Option<Vec<Spec>>> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let value = StructuredValue::decode(bytes)
        .map_err(|e| ClientError::data_loss(format!("Undecodable table signature: {e}")))?;
    let mut specs = Vec::new();
    for (path, leaf) in flatten(&value) {
        let (name, dtype, shape) = match &leaf.kind {
            Some(Kind::TensorSpecValue(s)) => (&s.name, s.dtype, shape_of(s.shape.as_ref())),
            Some(Kind::BoundedTensorSpecValue(s)) => (&s.name, s.dtype, shape_of(s.shape.as_ref())),
            other => {
                return Err(ClientError::invalid(format!(
                    "The table signature has a leaf at {} that is not a tensor spec ({other:?})",
                    path_string(&path)
                )))
            }
        };
        let name = if name.is_empty() {
            let keys: Vec<String> = path
                .iter()
                .map(|k| match k {
                    PathKey::Name(n) => n.clone(),
                    PathKey::Index(i) => i.to_string(),
                })
                .collect();
            keys.join("/")
        } else {
            name.clone()
        };
        specs.push(Spec {
            path: path_string(&path),
            name,
            dtype,
            shape,
        });
    }
    Ok(Some(specs))
}

/// Checks that one step (`leaves`: dtype and shape of each, in flattened order) fits
/// `table`'s signature, as the reference's inserts do: a leaf fits a spec of its own shape or
/// of its shape with a leading time dimension of 1. The error (INVALID_ARGUMENT) names the
/// table and the first mismatch.
pub fn check_step(table: &str, specs: &[Spec], leaves: &[(i32, &[i64])]) -> Result<()> {
    let timed: Vec<Vec<i64>> = leaves
        .iter()
        .map(|(_, shape)| std::iter::once(1).chain(shape.iter().copied()).collect())
        .collect();
    let leaves: Vec<(i32, &[i64], &[i64])> = leaves
        .iter()
        .zip(&timed)
        .map(|(&(dtype, shape), timed)| (dtype, shape, timed.as_slice()))
        .collect();
    match step_problem(table, specs, &leaves) {
        Some(problem) => Err(ClientError::invalid(problem)),
        None => Ok(()),
    }
}

/// The reference's message when one step does not fit `table`'s signature, else `None`.
/// `leaves` holds, per leaf in flattened order, its dtype, its shape (printed in the message)
/// and another shape it may fit by (a step with a leading time dimension of 1, or the legacy
/// writer's `[T, ...]` item column).
pub fn step_problem(
    table: &str,
    specs: &[Spec],
    leaves: &[(i32, &[i64], &[i64])],
) -> Option<String> {
    let start = format!(
        "Unable to CreateItem in table '{table}' because Append was called with a tensor \
         signature inconsistent with"
    );
    if specs.len() != leaves.len() {
        return Some(format!(
            "{start} table signature.  Append for timestep offset 0 was called with {} tensors, \
             but table requires {} tensors per entry.",
            leaves.len(),
            specs.len()
        ));
    }
    let (i, (spec, &(dtype, shape, _))) =
        specs
            .iter()
            .zip(leaves)
            .enumerate()
            .find(|(_, (spec, &(dtype, shape, other)))| {
                !spec.accepts(dtype, shape) && !spec.accepts(dtype, other)
            })?;
    let expected = spec
        .shape
        .as_ref()
        .map_or("<unknown>".to_string(), |d| dims(d));
    Some(format!(
        "{start} the table signature. At timestep offset 0, flattened index {i}, saw a \
         tensor of dtype {}, shape {}, but expected tensor '{}' of dtype {} and shape \
         compatible with {expected}.",
        tf_name(dtype),
        dims(shape),
        spec.name,
        tf_name(spec.dtype)
    ))
}

/// The flat signature of every table of a `ServerInfo` answer, by name (`None`: no
/// signature).
pub fn table_signatures(infos: &[TableInfo]) -> Result<HashMap<String, Option<Vec<Spec>>>> {
    infos
        .iter()
        .map(|info| Ok((info.name.clone(), decode_signature(&info.signature)?)))
        .collect()
}

/// Checks that an item (`columns`: dtype and shape of each of its columns, in flattened
/// order) fits `table`'s signature, as the reference's trajectory writer does before it
/// sends one. The error (INVALID_ARGUMENT) names the table and the first mismatch.
pub fn check_item(table: &str, specs: &[Spec], columns: &[(i32, Vec<i64>)]) -> Result<()> {
    let problem = if specs.len() != columns.len() {
        format!(
            "The table signature has {} columns but the trajectory has {}.",
            specs.len(),
            columns.len()
        )
    } else {
        let Some((i, (spec, (dtype, shape)))) = specs
            .iter()
            .zip(columns)
            .enumerate()
            .find(|(_, (spec, (dtype, shape)))| !spec.accepts(*dtype, shape))
        else {
            return Ok(());
        };
        let want = spec.shape.as_ref().map_or("?".to_string(), |d| dims(d));
        format!(
            "The table expects column {i} to be a {} {want} tensor but got a {} {} tensor.",
            tf_name(spec.dtype),
            tf_name(*dtype),
            dims(shape)
        )
    };
    Err(ClientError::invalid(format!(
        "Unable to create item in table '{table}' since the provided trajectory is \
         inconsistent with the table signature. {problem}"
    )))
}

/// `[2, ?]`, as TensorFlow's errors print dimensions.
fn dims(dims: &[i64]) -> String {
    let dims: Vec<String> = dims
        .iter()
        .map(|&d| if d < 0 { "?".into() } else { d.to_string() })
        .collect();
    format!("[{}]", dims.join(", "))
}

/// A dtype as TensorFlow's C++ names it (`float`, `double`, `int32`, ...), as the
/// reference's errors do.
pub fn tf_name(dtype: i32) -> String {
    match dtype {
        1 => "float".into(),
        2 => "double".into(),
        19 => "half".into(),
        _ => dtype_name(dtype),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reverb_proto::tensorflow::{
        DictValue, ListValue, NamedTupleValue, NoneValue, PairValue, TensorSpecProto,
    };

    fn spec(dtype: i32, dims: &[i64]) -> StructuredValue {
        StructuredValue {
            kind: Some(Kind::TensorSpecValue(TensorSpecProto {
                name: String::new(),
                shape: Some(TensorShapeProto::of(dims)),
                dtype,
            })),
        }
    }

    fn none() -> StructuredValue {
        StructuredValue {
            kind: Some(Kind::NoneValue(NoneValue {})),
        }
    }

    #[test]
    fn flattens_in_tf_nest_order_with_paths() {
        let dict = StructuredValue {
            kind: Some(Kind::DictValue(DictValue {
                fields: [
                    ("b".to_string(), none()),
                    (
                        "a".to_string(),
                        StructuredValue {
                            kind: Some(Kind::ListValue(ListValue {
                                values: vec![none(), none()],
                            })),
                        },
                    ),
                ]
                .into_iter()
                .collect(),
            })),
        };
        let named = StructuredValue {
            kind: Some(Kind::NamedTupleValue(NamedTupleValue {
                name: "T".into(),
                values: vec![
                    PairValue {
                        key: "z".into(),
                        value: Some(dict),
                    },
                    PairValue {
                        key: "y".into(),
                        value: Some(none()),
                    },
                ],
            })),
        };
        let paths: Vec<String> = flatten(&named)
            .iter()
            .map(|(p, _)| path_string(p))
            .collect();
        assert_eq!(
            paths,
            ["('z', 'a', 0)", "('z', 'a', 1)", "('z', 'b')", "('y',)"]
        );
        assert_eq!(path_string(&flatten(&none())[0].0), "()");
    }

    #[test]
    fn decodes_and_checks_specs() {
        let sig = StructuredValue {
            kind: Some(Kind::ListValue(ListValue {
                values: vec![spec(1, &[3, -1]), spec(3, &[])],
            })),
        };
        let specs = decode_signature(&sig.encode_to_vec()).unwrap().unwrap();
        assert_eq!(specs.len(), 2);
        assert!(specs[0].accepts(1, &[3, 7]));
        assert!(!specs[0].accepts(1, &[4, 7]));
        assert!(!specs[0].accepts(1, &[3]));
        assert!(!specs[0].accepts(2, &[3, 7]));
        assert!(specs[1].accepts(3, &[]));
        assert_eq!(specs[0].describe(), "float32[3, ?]");
        assert_eq!(decode_signature(&[]).unwrap(), None);
        assert!(decode_signature(&none().encode_to_vec()).is_err());
    }

    #[test]
    fn a_step_fits_its_own_shape_or_one_leading_step() {
        let spec = |name: &str, dtype, shape: Vec<i64>| Spec {
            path: format!("('{name}',)"),
            name: name.into(),
            dtype,
            shape: Some(shape),
        };
        let specs = vec![spec("a", 1, vec![2]), spec("b", 3, vec![-1, 3])];
        assert!(check_step("t", &specs, &[(1, &[2]), (3, &[1, 3])]).is_ok());
        assert!(check_step("t", &specs, &[(1, &[2]), (3, &[3])]).is_ok());
        assert!(check_step("t", &specs, &[(1, &[1, 2]), (3, &[3])]).is_err());
        let e = check_step("t", &specs, &[(1, &[2]), (1, &[3])]).unwrap_err();
        assert_eq!(e.code, tonic::Code::InvalidArgument);
        assert_eq!(
            e.message,
            "Unable to CreateItem in table 't' because Append was called with a tensor signature \
             inconsistent with the table signature. At timestep offset 0, flattened index 1, saw \
             a tensor of dtype float, shape [3], but expected tensor 'b' of dtype int32 and shape \
             compatible with [?, 3]."
        );
        let e = check_step("t", &specs, &[(1, &[3]), (3, &[3])]).unwrap_err();
        assert!(e.message.contains("flattened index 0"), "{}", e.message);
        let e = check_step("t", &specs, &[(1, &[2])]).unwrap_err();
        assert!(
            e.message
                .contains("called with 1 tensors, but table requires 2"),
            "{}",
            e.message
        );
    }

    #[test]
    fn an_item_fits_column_by_column_and_the_first_mismatch_is_named() {
        let specs = vec![
            Spec {
                path: "('obs',)".into(),
                name: "obs".into(),
                dtype: 1,
                shape: Some(vec![-1, 8]),
            },
            Spec {
                path: "('action',)".into(),
                name: "action".into(),
                dtype: 3,
                shape: None,
            },
        ];
        assert!(check_item("t", &specs, &[(1, vec![2, 8]), (3, vec![5, 1])]).is_ok());
        let e = check_item("t", &specs, &[(1, vec![2, 9]), (1, vec![])]).unwrap_err();
        assert_eq!(e.code, tonic::Code::InvalidArgument);
        assert_eq!(
            e.message,
            "Unable to create item in table 't' since the provided trajectory is inconsistent \
             with the table signature. The table expects column 0 to be a float [?, 8] tensor \
             but got a float [2, 9] tensor."
        );
        let e = check_item("t", &specs, &[(1, vec![2, 8]), (1, vec![])]).unwrap_err();
        assert!(e
            .message
            .ends_with("column 1 to be a int32 ? tensor but got a float [] tensor."));
        let e = check_item("t", &specs, &[(1, vec![2, 8])]).unwrap_err();
        assert!(e
            .message
            .ends_with("The table signature has 2 columns but the trajectory has 1."));
    }
}
