package sqs

// SendCalls returns the SendMessageBatch calls b made.
func SendCalls(b *Broker) int64 { return b.sendCalls.Load() }
