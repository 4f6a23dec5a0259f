package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/plugins"
	"github.com/ferryhq/ferry/sources/outbox"
	"github.com/ferryhq/ferry/sources/poll"
	"github.com/ferryhq/ferry/sources/wal"
	"github.com/ferryhq/ferry/sources/xid8"
)

// The events every system moves: order events over aggregates spread so
// that consecutive rows belong to different aggregates (the window may keep
// max_in_flight of them in flight), with a payload of a typical size.
const (
	aggregateType = "order"
	eventType     = "OrderPlaced"
	aggregates    = 10000
)

func aggregateID(i int) string { return "order-" + strconv.Itoa(i%aggregates) }

// eventPayload is event i's JSON body, about 150 bytes.
func eventPayload(i int) []byte {
	return fmt.Appendf(nil, `{"order_id":%q,"seq":%d,"customer_id":"customer-%d","amount":%d,"currency":"EUR","items":%d,"channel":"web"}`,
		aggregateID(i), i/aggregates+1, i%7919, 1000+i%9000, 1+i%5)
}

// prefillTx is how many rows one prefill transaction (one COPY) writes: a
// backlog of many small transactions, as services write them, made quickly.
const prefillTx = 100

// createOutbox creates a source's outbox table with the DDL `ferry schema`
// prints for it (the notify trigger included); for wal, the plain table.
func createOutbox(ctx context.Context, pool *pgxpool.Pool, source, table string) error {
	var ddl string
	var err error
	switch source {
	case xid8.Name:
		ddl, err = xid8.Schema(table)
	case poll.Name:
		ddl, err = poll.Schema(table)
	case wal.Name:
		ddl = outbox.DDL{Table: table}.SQL()
	default:
		return fmt.Errorf("unknown source %q", source)
	}
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, ddl)
	return err
}

// prepareSlot creates the wal pipeline's publication and slot before the
// backlog is written, so the pipeline streams the backlog from the slot
// (as after an outage) instead of reading it as its initial snapshot.
func prepareSlot(ctx context.Context, pool *pgxpool.Pool, pipeline, table string) error {
	name := wal.DefaultName(pipeline)
	if _, err := pool.Exec(ctx, wal.PublicationSQL(name, table)); err != nil {
		return fmt.Errorf("create publication: %w", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, name); err != nil {
		return fmt.Errorf("create slot: %w", err)
	}
	return nil
}

// dropSlot removes what prepareSlot (or the pipeline) created.
func dropSlot(ctx context.Context, pool *pgxpool.Pool, pipeline string) {
	name := wal.DefaultName(pipeline)
	_, _ = pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active`, name)
	_, _ = pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{name}.Sanitize())
}

// joinShared makes pipeline a member of the database's shared wal stream
// before the child runs it, as prepareSlot creates a pipeline's own slot:
// a shared member delivers what commits once it joined, and the bench
// writes as soon as the child is ready. It runs the member until it has
// its row, then stops it; the child resumes from the row.
func joinShared(ctx context.Context, pool *pgxpool.Pool, dsn, pipeline, table string) error {
	cfg := wal.DefaultConfig()
	cfg.DSN, cfg.Table, cfg.SlotMode, cfg.InitialSnapshot = dsn, table, wal.SlotModeShared, false
	src := wal.New(cfg, plugins.Env{Pipeline: pipeline, Logger: slog.New(slog.DiscardHandler)})
	if _, err := src.Subscribe(ctx, ""); err != nil {
		return err
	}
	defer src.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+wal.MembersTable+` WHERE pipeline = $1`, pipeline).Scan(&n); err == nil && n == 1 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not join the shared wal stream in a minute: %v", pipeline, src.Err())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// dropShared removes the shared slot, its publication and its members
// table that slot_mode: shared pipelines created.
func dropShared(ctx context.Context, pool *pgxpool.Pool) {
	_, _ = pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE slot_name LIKE 'ferry\_shared\_%' AND database = current_database() AND NOT active`)
	var name string
	if pool.QueryRow(ctx, `SELECT current_database()`).Scan(&name) == nil {
		_, _ = pool.Exec(ctx, `DROP PUBLICATION IF EXISTS `+pgx.Identifier{wal.SharedName(name)}.Sanitize())
	}
	_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS `+wal.MembersTable)
}

func dropTable(pool *pgxpool.Pool, table string) {
	_, _ = pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+outbox.Quote(table)+` CASCADE`)
}

// teardown undoes a measurement's set-up — its tables and slots — last
// first, as deferred calls would, when the set-up is spread over functions.
type teardown []func()

func (td *teardown) add(undo func()) { *td = append(*td, undo) }

// run undoes everything added, last first.
func (td *teardown) run() {
	for i := len(*td) - 1; i >= 0; i-- {
		(*td)[i]()
	}
	*td = nil
}

// setUpTable creates source's outbox table; td drops it.
func setUpTable(ctx context.Context, td *teardown, pool *pgxpool.Pool, source, table string) error {
	if err := createOutbox(ctx, pool, source, table); err != nil {
		return err
	}
	td.add(func() { dropTable(pool, table) })
	return nil
}

// setUpSlot prepares, for the wal source, pipeline's slot on table (see
// prepareSlot); td drops it. Other sources need none.
func setUpSlot(ctx context.Context, td *teardown, pool *pgxpool.Pool, source, pipeline, table string) error {
	if source != wal.Name {
		return nil
	}
	if err := prepareSlot(ctx, pool, pipeline, table); err != nil {
		return err
	}
	td.add(func() { dropSlot(context.Background(), pool, pipeline) })
	return nil
}

// prefill writes events [0, n) into a Ferry outbox table with COPY, in
// transactions of prefillTx rows on two connections, then vacuums it so
// every system reads a table in the same state (hint bits set, statistics).
func prefill(ctx context.Context, pool *pgxpool.Pool, table string, n int, progress func(int)) error {
	ident := outboxIdent(table)
	cols := []string{"aggregate_type", "aggregate_id", "type", "payload"}
	return copyChunks(ctx, pool, table, n, progress, func(ctx context.Context, conn *pgx.Conn, from, to int) error {
		_, err := conn.CopyFrom(ctx, ident, cols, pgx.CopyFromFunc(func() func() ([]any, error) {
			i := from
			return func() ([]any, error) {
				if i >= to {
					return nil, nil
				}
				row := []any{aggregateType, aggregateID(i), eventType, json.RawMessage(eventPayload(i))}
				i++
				return row, nil
			}
		}()))
		return err
	})
}

func outboxIdent(table string) pgx.Identifier {
	schema, name, _ := outbox.ParseTable(table)
	if schema == "" {
		return pgx.Identifier{name}
	}
	return pgx.Identifier{schema, name}
}

func copyChunks(ctx context.Context, pool *pgxpool.Pool, table string, n int, progress func(int), chunk func(context.Context, *pgx.Conn, int, int) error) error {
	var next, done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
				for {
					from := int(next.Add(prefillTx)) - prefillTx
					if from >= n {
						return nil
					}
					to := min(from+prefillTx, n)
					if err := chunk(ctx, c.Conn(), from, to); err != nil {
						return err
					}
					if progress != nil {
						progress(int(done.Add(int64(to - from))))
					}
				}
			})
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fmt.Errorf("prefill %s: %w", table, err)
	}
	if _, err := pool.Exec(ctx, `VACUUM (ANALYZE) `+outbox.Quote(table)); err != nil {
		return fmt.Errorf("vacuum %s: %w", table, err)
	}
	return nil
}

// watermillTable creates watermill-sql's messages and offsets tables for
// topic with its own schema and offsets adapters, and returns the messages
// table's name.
func watermillTable(ctx context.Context, pool *pgxpool.Pool, topic string) (string, error) {
	schema := wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: watermillBatch}
	offsets := wmsql.DefaultPostgreSQLOffsetsAdapter{}
	qs, err := schema.SchemaInitializingQueries(wmsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return "", err
	}
	oqs, err := offsets.SchemaInitializingQueries(wmsql.OffsetsSchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return "", err
	}
	for _, q := range append(qs, oqs...) {
		if _, err := pool.Exec(ctx, q.Query, q.Args...); err != nil {
			return "", err
		}
	}
	table := schema.MessagesTable(topic)
	// Watermill's publisher sets transaction_id to pg_current_xact_id() in
	// its INSERT; COPY cannot call it, so the column gets it as its default.
	if _, err := pool.Exec(ctx, `ALTER TABLE `+table+` ALTER COLUMN transaction_id SET DEFAULT pg_current_xact_id()`); err != nil {
		return "", err
	}
	return table, nil
}

// prefillForwarder writes the same events into watermill-sql's table as
// Watermill's forwarder publisher stores them: each payload is an envelope
// naming dest, the event's UUID, payload and metadata (its JSON form, as
// components/forwarder marshals its envelope).
func prefillForwarder(ctx context.Context, pool *pgxpool.Pool, topic, dest string, n int, progress func(int)) error {
	table := wmsql.DefaultPostgreSQLSchema{}.MessagesTable(topic)
	name := table[1 : len(table)-1]
	now := plugins.FormatTime(time.Now())
	return copyChunks(ctx, pool, name, n, progress, func(ctx context.Context, conn *pgx.Conn, from, to int) error {
		_, err := conn.CopyFrom(ctx, pgx.Identifier{name}, []string{"uuid", "payload", "metadata"}, pgx.CopyFromFunc(func() func() ([]any, error) {
			i := from
			return func() ([]any, error) {
				if i >= to {
					return nil, nil
				}
				env, _ := json.Marshal(struct {
					DestinationTopic string            `json:"destination_topic"`
					UUID             string            `json:"uuid"`
					Payload          []byte            `json:"payload"`
					Metadata         map[string]string `json:"metadata"`
				}{dest, eventID(i), eventPayload(i), map[string]string{
					plugins.MetaAggregateType: aggregateType,
					plugins.MetaAggregateID:   aggregateID(i),
					plugins.MetaEventType:     eventType,
					plugins.MetaCreatedAt:     now,
					plugins.MetaOutboxID:      strconv.Itoa(i + 1),
				}})
				row := []any{uuid.NewString(), string(env), "{}"}
				i++
				return row, nil
			}
		}()))
		return err
	})
}

// prefillWatermill writes the same events into watermill-sql's table: the
// payload, and as metadata what Ferry's sources put in theirs, so every
// sink publishes the same headers.
func prefillWatermill(ctx context.Context, pool *pgxpool.Pool, topic string, n int, progress func(int)) error {
	table := wmsql.DefaultPostgreSQLSchema{}.MessagesTable(topic)
	name := table[1 : len(table)-1] // unquote "watermill_<topic>"
	now := plugins.FormatTime(time.Now())
	return copyChunks(ctx, pool, name, n, progress, func(ctx context.Context, conn *pgx.Conn, from, to int) error {
		_, err := conn.CopyFrom(ctx, pgx.Identifier{name}, []string{"uuid", "payload", "metadata"}, pgx.CopyFromFunc(func() func() ([]any, error) {
			i := from
			return func() ([]any, error) {
				if i >= to {
					return nil, nil
				}
				md, _ := json.Marshal(map[string]string{
					plugins.MetaAggregateType: aggregateType,
					plugins.MetaAggregateID:   aggregateID(i),
					plugins.MetaEventType:     eventType,
					plugins.MetaCreatedAt:     now,
					plugins.MetaOutboxID:      strconv.Itoa(i + 1),
				})
				row := []any{eventID(i), string(eventPayload(i)), string(md)}
				i++
				return row, nil
			}
		}()))
		return err
	})
}

// writer inserts events one per transaction at a steady rate from several
// sessions, and remembers when each committed: the moment its INSERT
// (autocommit) returned, by outbox id.
type writer struct {
	pool    *pgxpool.Pool
	tables  []string // the i-th event goes to tables[i % len(tables)]
	rate    int
	session int

	mu      sync.Mutex
	commits map[int64]int64 // outbox id → commit unix ns
	written atomic.Int64
	behind  atomic.Int64 // inserts that started later than due (writer could not keep up)
}

// run writes until d passed or ctx ends; the i-th event is due at start +
// i/rate, taken by whichever session is free.
func (w *writer) run(ctx context.Context, d time.Duration, seq int) error {
	sqls := make([]string, len(w.tables))
	for i, table := range w.tables {
		sqls[i] = fmt.Sprintf(`INSERT INTO %s (aggregate_type, aggregate_id, type, payload) VALUES ($1, $2, $3, $4) RETURNING id`, outbox.Quote(table))
	}
	start := time.Now()
	total := int(float64(w.rate) * d.Seconds())
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, w.session)
	for range w.session {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= total || ctx.Err() != nil {
					return
				}
				due := start.Add(time.Duration(float64(i) / float64(w.rate) * float64(time.Second)))
				if late := time.Until(due); late > 0 {
					time.Sleep(late)
				} else if late < -10*time.Millisecond {
					w.behind.Add(1)
				}
				var id int64
				if err := w.pool.QueryRow(ctx, sqls[(seq+i)%len(sqls)], aggregateType, aggregateID(seq+i), eventType, json.RawMessage(eventPayload(seq+i))).Scan(&id); err != nil {
					errs <- err
					return
				}
				at := time.Now().UnixNano()
				w.mu.Lock()
				w.commits[id] = at
				w.mu.Unlock()
				w.written.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
