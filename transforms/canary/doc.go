// Package canary is empty: the canary is a feature of the engine now
// (engine/canary), configured by a pipeline's `canary:` section; the older
// form `transforms: [{type: canary, …}]` still loads, into the same
// section (pipelines.Canary).
//
// Deprecated: nothing here registers anything. The package remains only so
// that the blank imports of binaries built before the move still compile;
// drop the import.
package canary
