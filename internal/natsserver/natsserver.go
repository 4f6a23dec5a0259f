// Package natsserver runs an in-process NATS server with JetStream, for `ferry
// demo` and the tests when no $NATS_URL is given.
//
// It imports no other Ferry package. Of the product packages only
// internal/demo may import it: components talk to the NATS they are configured
// with.
package natsserver

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Server is an in-process NATS JetStream server.
type Server struct {
	*server.Server
	storeDir string
	ownDir   bool
	port     int
}

// Start runs a server on 127.0.0.1. port 0 picks a free port; storeDir ""
// makes a temporary JetStream store removed by Shutdown. Restarting on the
// same port and store directory brings the streams back (tests of a broker
// outage use that).
func Start(port int, storeDir string) (*Server, error) {
	own := false
	if storeDir == "" {
		d, err := os.MkdirTemp("", "ferry-nats-")
		if err != nil {
			return nil, err
		}
		storeDir, own = d, true
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	ns, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  storeDir,
		NoLog:     true,
		NoSigs:    true,
		// Keep JetStream's memory small: tests run many servers' worth of streams.
		JetStreamMaxMemory: 256 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("nats server: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("nats server not ready after 10s")
	}
	s := &Server{Server: ns, storeDir: storeDir, ownDir: own}
	if a, ok := ns.Addr().(*net.TCPAddr); ok {
		s.port = a.Port
	}
	return s, nil
}

// URL is the client URL.
func (s *Server) URL() string { return s.ClientURL() }

// StoreDir is the JetStream store directory.
func (s *Server) StoreDir() string { return s.storeDir }

// Port is the client port.
func (s *Server) Port() int { return s.port }

// Close shuts the server down and removes a temporary store. Safe to call twice.
func (s *Server) Close() {
	s.Shutdown()
	s.WaitForShutdown()
	if s.ownDir {
		os.RemoveAll(s.storeDir)
	}
}
