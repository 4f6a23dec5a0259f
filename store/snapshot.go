package store

import (
	"time"

	"github.com/ferryhq/ferry/pipelines"
)

// Snapshot is what an instance last read from the store, and what it made
// of it (service.Converger keeps it). The API serves it when the store
// cannot be read.
type Snapshot struct {
	Pipelines []Pipeline
	Tenants   []Tenant
	Tokens    []Token
	// Secrets are the tenants' secrets, opened, by tenant and name: what
	// tenant pipelines resolve with, kept so that resolution goes on while
	// the store cannot be read. In memory only; never serialised.
	Secrets map[string]map[string]string `json:"-"`
	// ReadAt is when the store was last read successfully.
	ReadAt time.Time
	// Stale is set when the last read failed: this is older news.
	Stale bool
	// StaleSince is when reads began to fail (the first failed read of
	// this outage); zero while the store answers.
	StaleSince time.Time
	// ReadError is the last failed read's error, on one line, without a
	// password; empty while the store answers.
	ReadError string
	// Files are the file-defined pipelines, by name.
	Files map[string]*pipelines.Spec `json:"-"`
	// Problems says, per pipeline name, why a store pipeline does not run on
	// this instance (its YAML does not load here, or a file defines the
	// same name).
	Problems map[string]string
	// Running is, per pipeline, what the instances running it reported,
	// freshest first.
	Running map[string][]InstanceStatus
}
