//! The catalog reads only cleanup makes: a range-partitioned table's key, partitions, detached
//! partitions and newest range, and what the current role may do with a table. The reads
//! several concerns share are `relay_postgres::catalog`'s.

pub(crate) mod privileges;
pub(crate) mod range_partitions;

pub use range_partitions::{NewestRange, newest_range, range_partitioned_on_one_column};
