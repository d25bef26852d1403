-- The seed design's Redis deduction, verbatim from shared/seeds/flash-sale-system-design.md §4,
-- for infra/bench/redis_seed.sh to measure.
-- Lua 脚本：seckill_deduct.lua
-- KEYS[1]: 存储商品库存的 Key (如 seckill:stock:1001)
-- KEYS[2]: 记录已抢购成功的用户 Set (如 seckill:users:1001)
-- ARGV[1]: 当前用户 ID

local stock_key = KEYS[1]
local users_key = KEYS[2]
local user_id = ARGV[1]

-- 1. 检查该用户是否已经抢购过 (单人限购一件)
if redis.call("SISMEMBER", users_key, user_id) == 1 then
    return -1 -- 重复下单错误码
end

-- 2. 获取当前剩余库存
local current_stock = tonumber(redis.call("GET", stock_key))
if current_stock == nil or current_stock <= 0 then
    return 0 -- 库存售罄
end

-- 3. 原子扣减库存并记录用户
redis.call("DECR", stock_key)
redis.call("SADD", users_key, user_id)

return 1 -- 秒杀成功!
