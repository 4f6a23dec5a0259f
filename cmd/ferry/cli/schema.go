package cli

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/xid8"
	"github.com/ferryhq/ferry/store"
)

// schemas are the DDL generators by source type.
var schemas = map[string]func(table string) (string, error){
	xid8.Name: xid8.Schema,
	poll.Name: poll.Schema,
	wal.Name:  wal.Schema,
	"store":   func(string) (string, error) { return store.SchemaSQL(), nil }, // the control-plane store (--store)
}

func schemaNames() string {
	var names []string
	for n := range schemas {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func schemaCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("schema", "SOURCE [--table NAME] [--aggregate-version]   (SOURCE: "+schemaNames()+")", stderr)
	table := fs.String("table", "outbox", "outbox table name, optionally schema-qualified")
	pipeline := fs.String("pipeline", "", "wal, slot_mode own: the pipeline's name, so the publication statement uses its default name (ferry_<pipeline>)")
	sharedDB := fs.String("shared-database", "", "wal, slot_mode shared (the default): the database the pipelines share a slot on, so the publication statement uses the shared name (ferry_shared_<database>)")
	version := fs.Bool("aggregate-version", false, "also add the aggregate_version column and the trigger that fills it (map it with source.columns.aggregate_version)")
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fs.Usage()
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	source := args[0]
	if code, ok := parse(fs, args[1:]); !ok {
		return code
	}
	gen, ok := schemas[source]
	if !ok {
		fmt.Fprintf(stderr, "ferry schema: unknown source %q (known: %s)\n", source, schemaNames())
		return 2
	}
	switch {
	case source != wal.Name && (*pipeline != "" || *sharedDB != ""):
		fmt.Fprintf(stderr, "ferry schema: --pipeline and --shared-database are for the wal source only\n")
		return 2
	case *pipeline != "" && *sharedDB != "":
		fmt.Fprintf(stderr, "ferry schema: give --pipeline (slot_mode own) or --shared-database (slot_mode shared), not both\n")
		return 2
	case *pipeline != "":
		gen = func(t string) (string, error) { return wal.SchemaFor(t, wal.DefaultName(*pipeline)) }
	case *sharedDB != "":
		gen = func(t string) (string, error) { return wal.SharedSchemaFor(t, *sharedDB) }
	}
	ddl, err := gen(*table)
	if err != nil {
		fmt.Fprintf(stderr, "ferry schema: --table: %v\n", err)
		return 2
	}
	if *version {
		v, err := outbox.AggregateVersionDDL(*table)
		if err != nil {
			fmt.Fprintf(stderr, "ferry schema: --table: %v\n", err)
			return 2
		}
		ddl += v
	}
	fmt.Fprint(stdout, ddl)
	return 0
}
