// Package sqs is ferry's AWS SQS adapter (broker.Broker) on
// github.com/aws/aws-sdk-go-v2/service/sqs. It is tested against ElasticMQ
// 1.6.11 with sqs-limits = strict (compose/local/services.sh up sqs), and
// its conformance suite and FIFO deduplication also against moto 5.1's
// standalone server (services.sh up moto); TestServersDiffer names where
// the two differ and what AWS documents.
//
// # Topology
//
// SQS has no exchange and no bindings. Declare creates, for each
// broker.Queue, a standard queue (a FIFO queue with Config.FIFO) named by
// QueueName from the exchange and the queue (e.g.
// "notifications__notifications-send") and its DLQ
// ("notifications__notifications-send-dlq"), both tagged ferry-exchange and
// ferry-queue, with a 14-day retention and, on the work queue, a
// RedrivePolicy to the DLQ with Config.MaxReceiveCount (100) as a safety
// net; a worker whose attempts are not below it refuses to start (Limits,
// package worker "Settings that must agree with the broker"), as does one
// with an AckDeadline or HandlerTimeout past SQS's 12-hour visibility
// limit, or retry delays that add up past the 14-day retention (a message
// retried in place keeps its send time, and SQS deletes it 14 days after
// it, also unread). Nothing warns before that retention deletes an unread
// message on a queue no worker reads: watch the CloudWatch metric
// ApproximateAgeOfOldestMessage (SQS's GetQueueAttributes does not report
// it) against the 14 days, and ferry_queue_messages for the backlog. It reads back the attributes and tags it set; a queue that exists
// with others (another maxReceiveCount, a FIFO queue where a standard one
// is declared, another ferry name) is an error wrapping
// broker.ErrTopologyMismatch. Publish does the routing: each message goes
// to every queue of the last declared exchange whose bindings match its
// Type ('*' and '#' included, so Capabilities.Wildcards is true); a
// message for two queues is two sends.
//
// # Publish
//
// SendMessageBatch, at most 10 entries per call and at most the queue's
// MaximumMessageSize bytes per call (the attribute is read at Declare; a
// server that does not report it, such as ElasticMQ, gets
// Config.FallbackMessageBytes, 256 KiB). Capabilities.MaxMessageBytes is
// the smallest limit minus a 2 KiB reserve for ferry's attributes and the
// headers DeadLetter adds (0 before Declare). A message larger than that,
// or whose SQS encoding is larger than the queue's limit, fails with
// broker.ErrMessageTooLarge before any call. The Successful and Failed
// lists of each call are reconciled per entry: a refused entry fails with
// SQS's code and message (a *broker.PublishError), wrapping
// broker.ErrInvalidMessage for a sender fault (e.g. a body character SQS
// refuses) and broker.ErrNacked for a server fault, and
// the accepted entries are never sent again.
//
// A call that fails as a whole is an outage or the messages' fault,
// after the SQS API reference's error lists (SendMessageBatch "Errors" and
// "Common Errors"): no HTTP answer (connection, timeout, ctx), HTTP 5xx
// (InternalFailure, ServiceUnavailable) and throttling (RequestThrottled,
// ThrottlingException, KmsThrottled, HTTP 429) after the SDK's 3 attempts,
// authentication and authorisation (HTTP 401 and 403, AccessDenied,
// InvalidClientTokenId, InvalidSecurity, MissingAuthenticationToken,
// NotAuthorized, RequestExpired, SignatureDoesNotMatch, OptInRequired),
// the queue's KMS key errors (Kms*), QueueDoesNotExist, InvalidAddress and
// UnsupportedOperation are outages: the messages of that call, and of that
// call only, fail with its error, which broker.IsMessageFault does not
// recognise. Any other HTTP 4xx answer is about the request
// (InvalidMessageContents, InvalidParameterValue, BatchRequestTooLong,
// MalformedQueryString, ValidationError, ElasticMQ's InvalidAction for a
// body its JSON parser refuses, such as one holding U+FFFF): the call's
// entries are sent again in halves (broker.SendSplitting) until the
// message(s) at fault are found; they alone fail, wrapping
// broker.ErrInvalidMessage, and the others are sent. Publish returns a
// *broker.PublishError listing only the messages not accepted, so the
// calls SQS accepted are never sent again; only when every message failed
// with one call's error does it return that error itself. Up to
// Config.SendConcurrency (16) calls of one Publish are in flight; on FIFO
// queues one queue's calls go one after another, in order, and after a
// failed call the later ones of that queue are not made (their messages
// fail with its error, or are sent after the refused ones are sorted out).
// A message without ID or Type fails with broker.ErrInvalidMessage before
// any call (they travel as attributes, and SQS takes no empty attribute
// value).
//
// A message is encoded as the body plus at most five message attributes
// (SQS allows ten): ferry-id, ferry-type, ferry-key, ferry-headers (every
// header, ferry's and the application's, as one JSON object) and
// ferry-encoding. A body that is valid UTF-8 is sent as is; SQS refuses
// characters outside #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD
// #x10000-#x10FFFF, and such a message fails on its own. A body that is not
// valid UTF-8 is base64-encoded (4/3 of its size); an empty one is "-".
//
// # FIFO deduplication
//
// On FIFO queues (Config.FIFO) a message's MessageDeduplicationId is its
// ID, the outbox row id (a hash of it when it is longer than 128
// characters or holds others than printable ASCII), so a row the relay publishes again (its mark
// failed after SQS accepted it: a relay crash, a lost database
// connection) has the same one. SQS drops a message whose
// MessageDeduplicationId it accepted in the last 5 minutes (AWS SQS
// Developer Guide, "Using the message deduplication ID"; the window
// cannot be changed), so inside that window the resend is not delivered
// again. ferry does not depend on it: after the window, or on a server
// that forgets the ID of a deleted message (moto 5.1 does; AWS and
// ElasticMQ keep it for the whole window), the resend is delivered as a
// second copy and the consumer's deduplication (package worker's
// processed_messages) acks it without running the handler. The window
// only saves that second delivery. The copies ferry makes itself (the DLQ
// copy of DeadLetter, a DLQ replay) carry an ID of their own
// (MessageDeduplicationId "<id>-dead-<receive count>",
// "<id>-replay-<n>") so the window does not drop them. TestFIFODedupInsideWindow checks this on ElasticMQ and moto;
// TestFIFODedupAfterWindow waits the 5 minutes out (make test-long).
//
// # Consume
//
// Subscribe runs Config.ReceivePollers pollers (by default one per 10
// messages of SubscribeOptions.Prefetch, at most 16), each a loop of
// ReceiveMessage calls of up to 10 messages, naming the message attributes
// and the system attributes ApproximateReceiveCount,
// ApproximateFirstReceiveTimestamp and SentTimestamp (AWS returns only
// what is named). While the queue is idle or trickling one poller at a
// time long-polls (WaitTimeSeconds = Config.WaitTime, 20 s; the HTTP
// client's timeout is 15 s longer), so an idle subscription costs one call
// per 20 s; a poller whose receive came back full is busy and receives
// again without waiting, and the next poller's long poll starts at once,
// so under load every poller receives at the same time within a few round
// trips. A busy poller waits, while the handlers still have buffered
// messages, until 10 fit under the prefetch: SQS bills each call. A long
// poll asks for a 5 s visibility timeout, raised to
// SubscribeOptions.AckDeadline as soon as the messages arrive, so the
// messages an abandoned long poll took (a closing process) come back
// within 5 s; a busy receive asks for the AckDeadline at once. Messages
// received and not yet
// handed out by Receive get a visibility heartbeat every third of the
// deadline; Delivery.Extend (ChangeMessageVisibility) keeps the handed-out
// ones. A buffered message received again anyway (its visibility ran out
// before a heartbeat: a stalled process, or entries SQS refused, which are
// logged) replaces its buffered copy, so a subscription never holds two
// copies of a message it has not handed out, and the Ack uses the newest
// receipt handle, the only one SQS promises to delete with. At most SubscribeOptions.Prefetch messages are received and not
// settled. Message.Attempt is the receive count, so redeliveries count
// (Capabilities.CountsRedeliveries). With SubscribeOptions.Ordered (FIFO
// only; standard queues return broker.ErrUnsupported) a message is handed
// out only when no earlier one of its Key is unsettled.
//
// # Settling
//
// Ack is DeleteMessageBatch, shared by the Acks of the next 2 ms of a
// subscription; an entry SQS refuses is deleted again with DeleteMessage,
// and its Ack fails if that fails too (naming both refusals). When the
// DeleteMessage succeeds the Ack returns nil and the refusal is reported
// to the broker.SettleObserver of the Ack's ctx (Recovered), so package
// worker logs and counts it. Settle errors are classified for
// broker.SettleReason: ReceiptHandleIsInvalid is "expired" (the
// visibility timeout ended and the message was received again), a
// deleted queue "not_found", throttling "throttled", any other SQS error
// "refused". Retry is ChangeMessageVisibility to the delay,
// rounded up to whole seconds, at least 1 s and at most 12 h
// (Capabilities.MaxDelay): the message stays the same
// (Capabilities.RetryInPlace), so the next delivery carries
// HeaderRetryCount (receive count - 1) and HeaderFirstFailedAt (the first
// receive's time) but not the retry's reason (package worker adds it from
// its attempt record). DeadLetter sends a copy to
// the DLQ with HeaderLastError, HeaderDeadAt, HeaderRetryCount and
// HeaderFirstFailedAt, then deletes the message, so the worker's last
// attempt does not wait for the RedrivePolicy. Subscription.Close and
// Broker.Close make the unsettled messages visible again once the long
// polls they cancelled have ended on the server (at most Config.WaitTime +
// 1 s): SQS would still hand such a poll a released message, counting a
// receive (an attempt) that no consumer sees.
//
// A settle that fails (network error, deleted queue) leaves the delivery
// open, so it may be settled again, but gives back its prefetch slot at
// once: the message comes back when its visibility timeout ends, and a
// subscription whose settles fail keeps receiving. With Ordered the Key
// stays held until the message is settled, unless the error says it is
// gone (queue deleted, receipt handle invalid).
//
// A queue deleted under a running process (AWS.SimpleQueueService.
// NonExistentQueue) is declared again by the next publish, receive or DLQ
// send, and the call repeated once; the conformance suite's
// TopologyDeleted checks it. A receive the server has not answered 2 s
// after its WaitTimeSeconds is abandoned and sent again: ElasticMQ never
// answers a long poll whose queue is deleted under it. AWS refuses to
// create a queue under the name of one deleted less than 60 s before (the
// process retries until it may); ElasticMQ does not.
//
// # Latency and calls in flight
//
// On AWS a call takes 10 to 20 ms from inside the region (loopback
// servers: well under 1 ms), so throughput is the calls in flight times
// 10 messages over the call's time. A relay batch of n rows is
// ceil(n / (10 × SendConcurrency)) round trips: the relay's default batch
// (100 rows) is one, and the relay's default 4 claim loops keep up to 40
// SendMessageBatch calls in flight. A worker receives with up to
// ReceivePollers calls and acks with DeleteMessageBatch calls of up to 10
// Acks each; since each handler waits for its Ack, a worker handles about
// Concurrency × BatchSize / (transaction + one round trip) messages a
// second, and Prefetch must cover what is in flight (receive, buffer,
// handlers, Acks): give it 2 × Concurrency × BatchSize or more. Measured
// with 15 ms added to every call (bench/README.md, "SQS scaling";
// BenchmarkSQSScaling, ferry bench --sqs-latency): the worker's defaults
// (Concurrency 10, Prefetch 10) handle 177 messages a second, Concurrency
// 64 with Prefetch 128 about 1,800, and a handler whose work is all in
// its transaction with BatchSize 10, Concurrency 40 and Prefetch 400
// about 3,000 (one transaction and one DeleteMessageBatch per 10). The
// HTTP client keeps 256 idle connections to the endpoint, so no call in
// flight opens one (on AWS, a TLS handshake).
//
// # DLQ
//
// DLQ(queue).List receives the whole DLQ with a 60 s visibility timeout,
// sorts it by HeaderDeadAt (then SentTimestamp) and makes it visible again;
// Replay sends the chosen messages to the work queue (HeaderRetryCount,
// HeaderLastError and HeaderDeadAt removed) before deleting them from the
// DLQ; Purge deletes them. A message SQS itself moved (RedrivePolicy) has
// no HeaderLastError; List reports the redrive as its reason. For a queue
// this broker did not declare, the DLQ is found on Config.LookupExchange,
// or by listing the server's queues for a name ending in the DLQ's name and
// a ferry-queue tag naming it (names cut to 80 characters need the
// exchange).
package sqs
