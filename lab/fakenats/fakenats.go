// Package fakenats is a TCP listener speaking just enough of the NATS
// client protocol for a client to connect: it sends INFO (advertising the
// servers a test chooses in connect_urls, as a cluster member does),
// answers PING with PONG and, if told to, drops each connection once the
// client's handshake is done, so the client reconnects through its server
// pool. It counts the connections it accepts. Tests use it to see which
// addresses a client dials when a server advertises others.
//
// It is lab code: only tests import it, and it imports no Ferry package.
package fakenats

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
)

// Server is one fake server. Create with Start; Close stops it.
type Server struct {
	ln       net.Listener
	info     []byte
	drop     bool
	accepted atomic.Int64

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  chan struct{}
}

// Options say what the server advertises and whether it drops clients.
type Options struct {
	// ConnectURLs are the "host:port" addresses INFO advertises.
	ConnectURLs []string
	// Drop closes each connection once the client's first PING was
	// answered (the handshake done): the client then reconnects.
	Drop bool
}

// Start listens on addr ("127.0.0.1:0" for any free port).
func Start(addr string, o Options) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	info, err := json.Marshal(map[string]any{
		"server_id": "fake", "server_name": "fake", "version": "2.10.0", "proto": 1, "go": "go1",
		"host": "127.0.0.1", "port": ln.Addr().(*net.TCPAddr).Port, "headers": true, "max_payload": 1 << 20,
		"connect_urls": o.ConnectURLs,
	})
	if err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{ln: ln, info: fmt.Appendf(nil, "INFO %s\r\n", info), drop: o.Drop,
		conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	go s.accept()
	return s, nil
}

// Addr is the server's "host:port".
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Port is the server's port.
func (s *Server) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// Accepted is how many connections the server accepted so far.
func (s *Server) Accepted() int { return int(s.accepted.Load()) }

// Close stops listening and closes every connection. Idempotent.
func (s *Server) Close() {
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		return
	default:
	}
	close(s.done)
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.ln.Close()
}

func (s *Server) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.accepted.Add(1)
		s.mu.Lock()
		select {
		case <-s.done:
			s.mu.Unlock()
			c.Close()
			return
		default:
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go s.serve(c)
	}
}

// serve speaks to one client: INFO, then PONG for each PING; every other
// line (CONNECT, SUB, PUB and its payload) is read and ignored.
func (s *Server) serve(c net.Conn) {
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	if _, err := c.Write(s.info); err != nil {
		return
	}
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if strings.HasPrefix(strings.ToUpper(line), "PING") {
			if _, err := c.Write([]byte("PONG\r\n")); err != nil || s.drop {
				return
			}
		}
	}
}
