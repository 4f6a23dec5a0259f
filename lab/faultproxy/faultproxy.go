// Package faultproxy is a TCP proxy that tests put between Ferry and one
// service to cut, stall or half-open the network between them.
//
// It is lab code: only tests import it, and it imports no Ferry package.
package faultproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy placed between the Ferry process under test and one
// service (PostgreSQL or a broker), so a test can break the network between
// them without touching the service or the other clients of it.
//
// Three faults:
//   - Cut resets every connection and refuses new ones until Heal: a
//     partition that the kernel reports (RST, connection refused).
//   - Stall stops moving bytes on every connection, old and new, until
//     Heal, when the bytes held flow on: a partition that heals before
//     either side's timeouts fire, or a frozen peer.
//   - Blackhole is Stall, except that at Heal only new connections work:
//     the old ones stay frozen until the client gives up on them, as a
//     half-open connection behind a rebooted NAT or firewall does.
type Proxy struct {
	ln net.Listener

	mu     sync.Mutex
	target string
	state  proxyState
	gate   chan struct{} // closed while bytes may flow
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

type proxyState int

const (
	statePass proxyState = iota
	stateCut
	stateStall
	stateBlackhole
)

// held says bytes wait at the gate: the gate channel is open (not yet
// closed) exactly in these states.
func (s proxyState) held() bool { return s == stateStall || s == stateBlackhole }

// link is one proxied connection.
type link struct {
	client, server net.Conn
	frozen         bool // blackholed: never flows again
	once           sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		if tc, ok := l.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as a dropped route or a killed peer gives
		}
		_ = l.client.Close()
		if l.server != nil {
			_ = l.server.Close()
		}
	})
}

// Start listens on a free port of 127.0.0.1 and forwards to target
// (which SetTarget may set later). It is closed when the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, gate: make(chan struct{}), links: map[*link]struct{}{}}
	close(p.gate)
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port, where the process under test connects.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// SetTarget changes where new connections go.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Cut resets every open connection and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.state.held() {
		close(p.gate) // release the held links: they are closed below
	}
	p.state = stateCut
	links := p.takeLinks()
	p.mu.Unlock()
	for _, l := range links {
		l.close()
	}
}

// Stall freezes every connection, and each new one, until Heal.
func (p *Proxy) Stall() { p.freeze(stateStall) }

// Blackhole freezes every connection for good; new ones opened after Heal
// work.
func (p *Proxy) Blackhole() { p.freeze(stateBlackhole) }

func (p *Proxy) freeze(s proxyState) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// The gate is open (closed channel) exactly while the state lets bytes flow.
	if !p.state.held() {
		p.gate = make(chan struct{})
	}
	p.state = s
}

// Heal ends the fault: bytes flow again (except on blackholed connections)
// and new connections are forwarded.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == stateBlackhole {
		for l := range p.links {
			// A connection still waiting to reach the service is a connect
			// attempt that gets through once the network is back.
			l.frozen = l.server != nil
		}
	}
	if p.state.held() {
		close(p.gate)
	}
	p.state = statePass
}

// Close stops the proxy and closes every connection. Safe to call twice.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	if p.state.held() {
		close(p.gate)
		p.state = statePass
	}
	links := p.takeLinks()
	p.mu.Unlock()
	_ = p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
}

func (p *Proxy) takeLinks() []*link {
	out := make([]*link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
		delete(p.links, l)
	}
	return out
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.state == stateCut || p.closed {
			p.mu.Unlock()
			(&link{client: c}).close()
			continue
		}
		l := &link{client: c}
		p.links[l] = struct{}{}
		target := p.target
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l, target)
	}
}

// serve dials the service once the gate allows, then copies both ways.
func (p *Proxy) serve(l *link, target string) {
	defer p.wg.Done()
	defer p.forget(l)
	if !p.wait(l) {
		return
	}
	s, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	p.mu.Lock()
	// Only a link still open gets its server: a Cut or Close that took it
	// closes it without the lock, and must not race this write.
	_, open := p.links[l]
	if open {
		l.server = s
	}
	p.mu.Unlock()
	if !open { // cut while dialling
		_ = s.Close()
		return
	}
	fromClient, fromServer := make(chan struct{}), make(chan struct{})
	go func() { p.pipe(l, l.server, l.client); close(fromClient) }()
	go func() { p.pipe(l, l.client, l.server); close(fromServer) }()
	select {
	case <-fromClient:
	case <-fromServer:
		if p.frozen(l) {
			<-fromClient // the client has to find out on its own
		}
	}
	l.close()
	<-fromClient
	<-fromServer
}

func (p *Proxy) frozen(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return l.frozen
}

func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.close()
}

// wait blocks while the link may not move bytes; false when the link was
// closed meanwhile or is frozen for good.
func (p *Proxy) wait(l *link) bool {
	for {
		p.mu.Lock()
		if _, ok := p.links[l]; !ok || l.frozen {
			p.mu.Unlock()
			return false
		}
		gate := p.gate
		open := !p.state.held()
		p.mu.Unlock()
		if open {
			return true
		}
		<-gate
	}
}

// pipe copies src to dst. A chunk read while the proxy is stalled is held
// until Heal; on a blackholed link, what the client sends is read and
// dropped (so its close is noticed) and nothing reaches the other side.
func (p *Proxy) pipe(l *link, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(l) {
				if src == l.client {
					// Frozen: keep draining the client until it gives up.
					_, _ = io.Copy(io.Discard, src)
				}
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
			}
			return
		}
	}
}
