package cli

import (
	"fmt"
	"io"
	"os"

	"github.com/ferryhq/ferry/internal/migrate"
)

// migrateCmd prints the Ferry pipeline equivalent to another relay's
// configuration: `ferry migrate debezium CONNECTOR.json|.properties`.
func migrateCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("migrate", "debezium [--reuse-slot] [--brokers LIST] [--password-env VAR] CONNECTOR.json|CONNECTOR.properties", stderr)
	reuse := fs.Bool("reuse-slot", false, "stream the connector's own replication slot and publication (pgoutput only): Ferry resumes where Debezium's slot was confirmed")
	brokers := fs.String("brokers", "${KAFKA_BROKERS}", "Kafka brokers for the sink when the configuration does not name them (Kafka Connect keeps them in the worker config)")
	passwordEnv := fs.String("password-env", "DEBEZIUM_DB_PASSWORD", "environment variable the DSN reads the database password from (the password is never copied)")
	if len(args) == 0 || args[0] != "debezium" {
		fs.Usage()
		if len(args) > 0 && args[0] != "-h" && args[0] != "--help" {
			fmt.Fprintf(stderr, "ferry migrate: unknown system %q (known: debezium)\n", args[0])
			return 2
		}
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if code, ok := parse(fs, args[1:]); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	data, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "ferry migrate: %v\n", err)
		return 1
	}
	cfg, err := migrate.Parse(data)
	if err != nil {
		fmt.Fprintf(stderr, "ferry migrate: %s: %v\n", fs.Arg(0), err)
		return 1
	}
	res, err := migrate.Debezium(cfg, migrate.Options{ReuseSlot: *reuse, Brokers: *brokers, PasswordVar: *passwordEnv})
	if err != nil {
		fmt.Fprintf(stderr, "ferry migrate: %s: %v\n", fs.Arg(0), err)
		return 1
	}
	fmt.Fprint(stdout, res.YAML)
	if n := len(res.Unmapped); n > 0 {
		fmt.Fprintf(stderr, "%d option(s) not translated; each is listed at the end of the YAML with why\n", n)
	}
	return 0
}
