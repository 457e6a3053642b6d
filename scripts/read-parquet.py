"""Read a Parquet file that ragline wrote, with pyarrow and with DuckDB, and print what each
saw as one JSON object on stdout (the Parquet tests compare it with ragline's JSONL output).

    $(scripts/data-venv.sh) scripts/read-parquet.py FILE.parquet [--summary]

With --summary, only the counts (rows as pyarrow's metadata and DuckDB count them, row groups,
vectors), without loading the rows: for files of millions of rows.
"""

import json
import sys

import duckdb
import pyarrow.parquet as pq


def main() -> None:
    path = sys.argv[1]
    if sys.argv[2:] == ["--summary"]:
        meta = pq.ParquetFile(path).metadata
        rows, vectors = duckdb.connect().execute(
            "SELECT count(*), count(vector) FROM read_parquet(?)", [path]
        ).fetchone()
        print(json.dumps({"rows": meta.num_rows, "row_groups": meta.num_row_groups,
                          "duckdb_rows": rows, "duckdb_vectors": vectors}))
        return
    table = pq.read_table(path)
    meta = pq.ParquetFile(path).metadata
    rows = table.to_pylist()
    con = duckdb.connect()
    duck = con.execute(
        "SELECT id, vector FROM read_parquet(?) ORDER BY id", [path]
    ).fetchall()
    vector_type = str(table.schema.field("vector").type) if "vector" in table.schema.names else None
    print(
        json.dumps(
            {
                "columns": table.schema.names,
                "vector_type": vector_type,
                "rows": table.num_rows,
                "row_groups": meta.num_row_groups,
                "compression": meta.row_group(0).column(0).compression if meta.num_row_groups else None,
                "pyarrow": {r["id"]: r for r in rows},
                "duckdb": {i: (list(v) if v is not None else None) for i, v in duck},
            }
        )
    )


if __name__ == "__main__":
    main()
