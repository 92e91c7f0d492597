package redislock

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// The Lua scripts, in lua/. Every operation is one script so that it is one
// round trip and atomic on the server. All keys of one name share the hash
// tag {<escaped name>}, so the scripts also run on Redis Cluster. Each file
// states its KEYS, ARGV and reply, and runs on its own, for example
//
//	redis-cli --eval lua/mutex_acquire.lua 'lock:{x}:lock' 'lock:{x}:token' \
//	    'lock:{x}:slots' 'lock:{x}:permits' 'lock:{x}:tomb:0123' , '0123:' 30000 '{}' 86400000 ''
//
// The keys of a name (see keysFor): lock (string, a mutex holder), token
// (counter), slots (zset of semaphore permit ids scored by expiry in server
// milliseconds), permits (hash: permit id -> "token:since:meta", and
// "#limit" -> the semaphore's limit), and for acquire and release the id's
// tombstone (see keys.tombOf). A name held shared keeps its readers in
// slots and permits like a semaphore's permits, with "#limit" 1, and a
// writer waiting for them sets the lock to a placeholder,
// "shared:token:since:", followed by the queue (lua/mutex_acquire.lua);
// rwait marks that readers wait for the lock (lua/shared_acquire.lua).
//
// A holder is identified by a random id that is unique per acquisition. A
// mutex holder's value is "id:token:since:meta", followed by the queue of
// its waiters (see lua/mutex_acquire.lua); only the id is compared, so
// a holder whose acquire reply was lost can still be cleaned up by its id.
// The mutex scripts get the id with its ':' ("id:"), the prefix of the
// value; the semaphore scripts get it without.
//
// Release (also the cleanup of a failed attempt) writes the id's tombstone,
// which lives for one TTL, and acquire refuses an id that has one: an
// acquire request that reaches the server only after its attempt was given
// up (delayed past the client's timeout, then cleaned up; or retried by the
// client on another connection, held, and released) would otherwise take
// the name for an id nobody holds, for a whole TTL.
//
// Numbers: Lua numbers are doubles and redis.call turns them into strings
// with 14 significant digits, so every number written to Redis is formatted
// with %d first.
var (
	//go:embed lua/mutex_acquire.lua
	mutexAcquireSrc string
	//go:embed lua/mutex_release.lua
	mutexReleaseSrc string
	//go:embed lua/mutex_extend.lua
	mutexExtendSrc string
	//go:embed lua/mutex_extend_many.lua
	mutexExtendManySrc string
	//go:embed lua/shared_acquire.lua
	sharedAcquireSrc string
	//go:embed lua/sem_acquire.lua
	semAcquireSrc string
	//go:embed lua/sem_release.lua
	semReleaseSrc string
	//go:embed lua/sem_extend.lua
	semExtendSrc string
	//go:embed lua/inspect.lua
	inspectSrc string
	//go:embed lua/fence.lua
	fenceSrc string
)

var (
	mutexAcquire  = redis.NewScript(mutexAcquireSrc)
	mutexRelease  = redis.NewScript(mutexReleaseSrc)
	mutexExtend   = redis.NewScript(mutexExtendSrc)
	mutexExtendN  = redis.NewScript(mutexExtendManySrc)
	sharedAcquire = redis.NewScript(sharedAcquireSrc)
	semAcquire    = redis.NewScript(semAcquireSrc)
	semRelease    = redis.NewScript(semReleaseSrc)
	semExtend     = redis.NewScript(semExtendSrc)
	inspectScript = redis.NewScript(inspectSrc)
	fenceScript   = redis.NewScript(fenceSrc)
)
