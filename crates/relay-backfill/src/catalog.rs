//! The catalog reads only the backfill makes: a table's shape as pgoutput would describe it and
//! the key its pages go by. The reads several concerns share are `relay_postgres::catalog`'s.

pub(crate) mod table_shape;
