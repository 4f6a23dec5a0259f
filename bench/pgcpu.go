package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pgCPU measures the CPU time of the PostgreSQL backends serving the system
// under test: every backend of the bench database except the bench's own
// sessions (application_name benchApplication) and the sampling session —
// one system runs at a time, so that is the system's share of the database.
// It reads each backend's utime+stime from /proc/<pid>/stat (the server
// runs on this machine; pg_stat_statements is not installed and would miss
// replication), sampling while the system runs: a backend that exits
// between two samples loses at most the CPU of the last interval.
// Background processes (checkpointer, WAL writer) are not counted.
type pgCPU struct {
	pool  *pgxpool.Pool
	base  map[int32]float64 // CPU of each backend before the window
	last  map[int32]float64 // latest CPU seen
	at    time.Time         // last sample
	read  bool              // some backend's /proc was readable
	err   error
	every time.Duration
}

// benchApplication is the application_name of the bench's own sessions.
const benchApplication = "ferry-bench"

// pgCPUSampleEvery is how often a running measurement samples the backends.
const pgCPUSampleEvery = time.Second

func startPGCPU(ctx context.Context, pool *pgxpool.Pool) *pgCPU {
	p := &pgCPU{pool: pool, last: map[int32]float64{}, every: pgCPUSampleEvery}
	p.sample(ctx)
	p.base = p.last
	p.last = map[int32]float64{}
	for pid, c := range p.base {
		p.last[pid] = c
	}
	return p
}

// tick samples if the last sample is older than the interval.
func (p *pgCPU) tick(ctx context.Context) {
	if time.Since(p.at) >= p.every {
		p.sample(ctx)
	}
}

func (p *pgCPU) sample(ctx context.Context) {
	p.at = time.Now()
	rows, err := p.pool.Query(ctx, `SELECT pid FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()
		AND application_name IS DISTINCT FROM $1`, benchApplication)
	if err != nil {
		p.err = err
		return
	}
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err == nil {
			pids = append(pids, pid)
		}
	}
	rows.Close()
	for _, pid := range pids {
		c, err := postgresCPU(int(pid))
		if err != nil {
			continue
		}
		p.read = true
		p.last[pid] = max(p.last[pid], c)
	}
}

// seconds is the backends' CPU over the window and how many there were;
// ok is false when no backend could be read (a database on another host).
func (p *pgCPU) seconds() (secs float64, backends int, ok bool) {
	for pid, c := range p.last {
		d := c - p.base[pid]
		if d > 0 {
			secs += d
			backends++
		}
	}
	return secs, backends, p.read
}

// postgresCPU is a PostgreSQL process's user+system CPU seconds, from /proc.
func postgresCPU(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return 0, fmt.Errorf("unexpected /proc/%d/stat", pid)
	}
	if comm := s[open+1 : end]; !strings.HasPrefix(comm, "postgres") {
		return 0, fmt.Errorf("process %d is %q, not a PostgreSQL backend", pid, comm)
	}
	return statCPU(s[end+1:])
}

// statCPU is utime+stime in seconds from the fields after a /proc stat
// line's command name.
func statCPU(fields string) (float64, error) {
	f := strings.Fields(fields)
	if len(f) < 13 {
		return 0, fmt.Errorf("unexpected /proc stat")
	}
	var utime, stime int64
	if _, err := fmt.Sscan(f[11], &utime); err != nil {
		return 0, err
	}
	if _, err := fmt.Sscan(f[12], &stime); err != nil {
		return 0, err
	}
	return float64(utime+stime) / clockTicks, nil
}
