// Package e2e holds end-to-end tests of ferry across the API, the relay
// and the worker, run in-process through the ferry command
// (cmd/ferry/ferrycli) against the real servers of
// compose/local/services.sh, once for every broker in ferrycli.Brokers.
//
// Each test works on its own database (testenv.NewDatabase) and its own
// exchange and queue names, and tags its mails with a unique subject so it
// finds exactly its own in Mailpit. Outage tests stop and start a server
// and so never run in parallel.
package e2e
