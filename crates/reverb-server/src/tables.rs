//! `Tables`: the fixed set of tables a server serves, by name.

use reverb_core::Table;
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::Status;

/// A server's tables by name. Cheap to clone (shared).
#[derive(Clone)]
pub struct Tables(Arc<BTreeMap<String, Arc<Table>>>);

impl Tables {
    /// The tables; names must be unique, and there must be at least one.
    pub fn new(tables: Vec<Arc<Table>>) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for t in tables {
            let name = t.name().to_string();
            if map.insert(name.clone(), t).is_some() {
                return Err(format!(
                    "Table names must be unique; '{name}' appears more than once"
                ));
            }
        }
        if map.is_empty() {
            return Err("At least one table must be provided".to_string());
        }
        Ok(Self(Arc::new(map)))
    }

    /// The table called `name`, or NOT_FOUND listing the tables that exist.
    pub fn get(&self, name: &str) -> Result<Arc<Table>, Status> {
        self.0.get(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = self.0.keys().map(String::as_str).collect();
            Status::not_found(format!(
                "Priority table {} was not found. Available tables: [{}]",
                crate::status::echo(name),
                known.join(", ")
            ))
        })
    }

    /// Every table, in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Table>> {
        self.0.values()
    }

    /// Every table, in name order.
    pub fn to_vec(&self) -> Vec<Arc<Table>> {
        self.0.values().cloned().collect()
    }
}
