package pgsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/internal/redact"
	"github.com/ferryhq/ferry/internal/retry"
)

// One LISTEN connection per database serves every pipeline of the process:
// a hundred pipelines on one database hold one listening session, not a
// hundred. Pipelines join and leave as they start and stop; the session
// LISTENs to the union of their channels and hands each notification to the
// pipelines of its channel.

// listenCheck is how long a listening session may be quiet before it is
// asked to answer (within a third of it) to show it is alive.
var listenCheck = 15 * time.Second

// listeners holds the sessions by connection string.
var listeners = struct {
	sync.Mutex
	m map[string]*listener
}{m: map[string]*listener{}}

// Configured is a pool whose configuration the LISTEN session connects
// with: a pipeline's Pool, or a *pgxpool.Pool.
type Configured interface {
	Config() *pgxpool.Config
}

// subscriber is one pipeline's interest in a channel.
type subscriber struct {
	channel   string
	wake      func(payload string)
	listening func(bool)
	on        bool // told listening(true) in the current session
}

// listener is the shared session of one database.
type listener struct {
	cfg     *pgx.ConnConfig
	log     *slog.Logger
	changed chan struct{} // a subscriber joined or left
	stop    context.CancelFunc
	done    chan struct{}

	mu   sync.Mutex
	subs map[*subscriber]struct{}
}

// Listen calls wake with the payload of every notification on channel,
// until ctx ends.
// Notifications are hints: they are lost while the shared session
// reconnects (with backoff), which is why sources keep polling.
//
// listening, if not nil, is told when notifications start and stop coming:
// while they do, a source may poll a quiet table less often.
//
// The session connects with pool's configuration (application_name
// ferry:listen) and is not one of pool's connections.
func Listen(ctx context.Context, pool Configured, channel string, log *slog.Logger, wake func(payload string), listening func(bool)) {
	if listening == nil {
		listening = func(bool) {}
	}
	sub := &subscriber{channel: channel, wake: wake, listening: listening}
	l := join(pool, log, sub)
	<-ctx.Done()
	l.leave(pool, sub)
}

func join(pool Configured, log *slog.Logger, sub *subscriber) *listener {
	key := pool.Config().ConnString()
	listeners.Lock()
	defer listeners.Unlock()
	l := listeners.m[key]
	if l == nil {
		cfg := pool.Config().ConnConfig.Copy()
		cfg.RuntimeParams["application_name"] = "ferry:listen"
		ctx, stop := context.WithCancel(context.Background())
		l = &listener{cfg: cfg, log: log.With("listen", redact.String(cfg.Host)), changed: make(chan struct{}, 1),
			stop: stop, done: make(chan struct{}), subs: map[*subscriber]struct{}{}}
		listeners.m[key] = l
		go l.run(ctx)
	}
	l.mu.Lock()
	l.subs[sub] = struct{}{}
	l.mu.Unlock()
	Signal(l.changed)
	return l
}

func (l *listener) leave(pool Configured, sub *subscriber) {
	key := pool.Config().ConnString()
	listeners.Lock()
	l.mu.Lock()
	delete(l.subs, sub)
	last := len(l.subs) == 0
	if sub.on {
		sub.on = false
		sub.listening(false)
	}
	l.mu.Unlock()
	if last && listeners.m[key] == l {
		delete(listeners.m, key)
		l.stop()
	}
	listeners.Unlock()
	if last {
		<-l.done
	} else {
		Signal(l.changed)
	}
}

func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	bo := retry.Backoff()
	for ctx.Err() == nil {
		err := l.session(ctx, bo.Reset)
		l.setListening(nil)
		if ctx.Err() != nil {
			return
		}
		d := bo.NextBackOff()
		l.log.Warn("listen for notifications; polling meanwhile", "err", redact.Error(err), "retry_in", d.Round(time.Millisecond))
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
}

// session connects and serves until the connection fails or ctx ends.
func (l *listener) session(ctx context.Context, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	listened := map[string]bool{}
	// Only a change of subscribers needs LISTEN/UNLISTEN, not every
	// notification: this session serves every pipeline on the database.
	resync := true
	for {
		if resync {
			// Bounded like the ping below: a connection that died without
			// an error would hold LISTEN for as long as TCP retries.
			syncCtx, cancel := context.WithTimeout(ctx, listenCheck/3)
			err := l.sync(syncCtx, conn, listened)
			cancel()
			if err != nil {
				return err
			}
			connected()
			l.setListening(listened)
		}
		// Wait for a notification, until the channels change, or for
		// listenCheck: a cancelled wait leaves the connection usable.
		waitCtx, cancel := context.WithTimeout(ctx, listenCheck)
		changed := make(chan bool, 1)
		go func() {
			select {
			case <-l.changed:
				changed <- true
				cancel()
			case <-waitCtx.Done():
				changed <- false
			}
		}()
		n, err := conn.WaitForNotification(waitCtx)
		interrupted := waitCtx.Err() != nil && ctx.Err() == nil
		quiet := errors.Is(waitCtx.Err(), context.DeadlineExceeded)
		cancel()
		resync = <-changed // a change that raced the notification is not lost
		if err != nil {
			if !interrupted || conn.IsClosed() {
				return err
			}
			if quiet {
				// A connection that died without an error (a partition, a
				// NAT that forgot it) waits for ever: ask it for an answer.
				pingCtx, cancel := context.WithTimeout(ctx, listenCheck/3)
				err := conn.Ping(pingCtx)
				cancel()
				if err != nil {
					return fmt.Errorf("no answer from the listening session: %w", err)
				}
			}
			continue
		}
		l.mu.Lock()
		for sub := range l.subs {
			if sub.channel == n.Channel {
				sub.wake(n.Payload)
			}
		}
		l.mu.Unlock()
	}
}

// sync LISTENs to every subscriber's channel and UNLISTENs the rest.
func (l *listener) sync(ctx context.Context, conn *pgx.Conn, listened map[string]bool) error {
	want := map[string]bool{}
	l.mu.Lock()
	for sub := range l.subs {
		want[sub.channel] = true
	}
	l.mu.Unlock()
	for ch := range want {
		if !listened[ch] {
			if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
				return err
			}
			listened[ch] = true
		}
	}
	for ch := range listened {
		if !want[ch] {
			if _, err := conn.Exec(ctx, "UNLISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
				return err
			}
			delete(listened, ch)
		}
	}
	return nil
}

// setListening tells each subscriber whether notifications on its channel
// come (nil: none do). One that joined after the last sync is told at the
// next.
func (l *listener) setListening(listened map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for sub := range l.subs {
		if on := listened[sub.channel]; sub.on != on {
			sub.on = on
			sub.listening(on)
		}
	}
}
