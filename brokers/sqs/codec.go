package sqs

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/ferrymq/ferry/broker"
)

// The message attributes ferry sets: at most five whatever the
// application's headers, which are packed into one (SQS allows 10).
const (
	attrID       = "ferry-id"
	attrType     = "ferry-type"
	attrKey      = "ferry-key"
	attrHeaders  = "ferry-headers"  // JSON object of the headers
	attrEncoding = "ferry-encoding" // "base64" or "empty"; absent: the body as is
)

// attrNames are the message attributes Receive asks for: AWS returns only
// those named.
var attrNames = []string{attrID, attrType, attrKey, attrHeaders, attrEncoding}

// sysAttrNames are the system attributes Receive asks for.
var sysAttrNames = []types.MessageSystemAttributeName{
	types.MessageSystemAttributeNameApproximateReceiveCount,
	types.MessageSystemAttributeNameApproximateFirstReceiveTimestamp,
	types.MessageSystemAttributeNameSentTimestamp,
}

// encoded is a message in SQS's shape.
type encoded struct {
	body  string
	attrs map[string]types.MessageAttributeValue
	size  int // bytes SQS counts: the body plus each attribute's name, type and value
}

func strAttr(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

// encode maps m to an SQS body and attributes. A body that is valid UTF-8
// is sent as is (ferry's JSON events stay readable in the console); SQS
// refuses characters outside #x9 #xA #xD #x20-#xD7FF #xE000-#xFFFD
// #x10000-#x10FFFF, and such a message fails on its own. Any other body is
// base64-encoded (4/3 of its size); an empty one is sent as "-".
func encode(m *broker.Message, headers map[string]string) (encoded, error) {
	e := encoded{attrs: map[string]types.MessageAttributeValue{}}
	switch {
	case len(m.Body) == 0:
		e.body = "-"
		e.attrs[attrEncoding] = strAttr("empty")
	case utf8.Valid(m.Body):
		e.body = string(m.Body)
	default:
		e.body = base64.StdEncoding.EncodeToString(m.Body)
		e.attrs[attrEncoding] = strAttr("base64")
	}
	e.attrs[attrID] = strAttr(m.ID)
	e.attrs[attrType] = strAttr(m.Type)
	if m.Key != "" {
		e.attrs[attrKey] = strAttr(m.Key)
	}
	if len(headers) > 0 {
		j, err := json.Marshal(headers)
		if err != nil {
			return e, fmt.Errorf("sqs: encode headers of %s: %w", m.ID, err)
		}
		e.attrs[attrHeaders] = strAttr(string(j))
	}
	e.size = len(e.body)
	for k, v := range e.attrs {
		e.size += len(k) + len(*v.DataType) + len(aws.ToString(v.StringValue))
	}
	return e, nil
}

// decode maps a received SQS message back. Attempt is the receive count
// (ApproximateReceiveCount) plus a HeaderRetryCount carried in the body's
// headers; a message received before gets HeaderRetryCount (receive
// count - 1) and HeaderFirstFailedAt (the first receive's time,
// ApproximateFirstReceiveTimestamp) when it does not carry them. With
// counted false (DLQ reads) the receive count is ignored: Attempt is the
// carried HeaderRetryCount + 1.
func decode(sm types.Message, counted bool) (*broker.Message, error) {
	m := &broker.Message{}
	get := func(k string) string {
		if v, ok := sm.MessageAttributes[k]; ok {
			return aws.ToString(v.StringValue)
		}
		return ""
	}
	m.ID = get(attrID)
	if m.ID == "" {
		m.ID = aws.ToString(sm.MessageId)
	}
	m.Type = get(attrType)
	m.Key = get(attrKey)
	body := aws.ToString(sm.Body)
	switch get(attrEncoding) {
	case "empty":
		m.Body = []byte{}
	case "base64":
		b, err := base64.StdEncoding.DecodeString(body)
		if err != nil {
			return nil, fmt.Errorf("sqs: message %s: base64 body: %w", m.ID, err)
		}
		m.Body = b
	default:
		m.Body = []byte(body)
	}
	if h := get(attrHeaders); h != "" {
		if err := json.Unmarshal([]byte(h), &m.Headers); err != nil {
			return nil, fmt.Errorf("sqs: message %s: headers: %w", m.ID, err)
		}
	}
	carried, _ := strconv.Atoi(m.Headers[broker.HeaderRetryCount])
	if !counted {
		m.Attempt = carried + 1
		return m, nil
	}
	rc, _ := strconv.Atoi(sm.Attributes[string(types.MessageSystemAttributeNameApproximateReceiveCount)])
	if rc < 1 {
		rc = 1
	}
	m.Attempt = carried + rc
	if rc > 1 {
		if m.Headers == nil {
			m.Headers = map[string]string{}
		}
		m.Headers[broker.HeaderRetryCount] = strconv.Itoa(m.Attempt - 1)
		if m.Headers[broker.HeaderFirstFailedAt] == "" {
			if t := msTime(sm.Attributes[string(types.MessageSystemAttributeNameApproximateFirstReceiveTimestamp)]); !t.IsZero() {
				m.Headers[broker.HeaderFirstFailedAt] = broker.FormatTime(t)
			}
		}
	}
	return m, nil
}

// msTime parses an SQS timestamp attribute (epoch milliseconds).
func msTime(s string) time.Time {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
